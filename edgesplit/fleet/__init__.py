"""A fleet: many devices of several kinds sharing one batching server, planned together.

``spec`` reads the fleet file, ``price`` prices one choice of plans (queueing and batching at the
server), ``plan`` searches the choices, ``candidates`` makes a group's candidate plans from the
optimiser, ``report`` turns the choice into the report.
"""

from edgesplit.fleet.plan import FleetChoice, plan_fleet
from edgesplit.fleet.price import Candidate, FleetTable, Group, Pricing, Server

__all__ = ["Candidate", "FleetChoice", "FleetTable", "Group", "Pricing", "Server", "plan_fleet"]
