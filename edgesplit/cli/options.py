"""Option groups shared by the subcommands: each declares its options once and hands the command
one frozen dataclass instead of a keyword argument per option.

A group is made with :func:`option_group`: the options in the order ``--help`` shows them, and the
dataclass whose fields are the options' parameter names. A command then reads ``plan.objective``
rather than taking ``objective`` among thirty parameters, and a flag added to a group reaches
every command that has the group.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from edgesplit.cli.common import (
    FiniteFloat,
    backend_option,
    device_option,
    file_option,
    input_shape_option,
    input_values_option,
    model_argument,
    objective_option,
    pin_option,
    runs_option,
    slo_option,
    split_option,
    stage_limit_options,
)

if TYPE_CHECKING:
    from edgesplit.backends.tvm.tune import TuneOptions
    from edgesplit.precision.metrics import AccuracyBudget
    from edgesplit.profile.ssh import SshOptions
    from edgesplit.workflows.resolve import Choices
    from edgesplit.workflows.verify import VerifyOptions


@dataclasses.dataclass(frozen=True)
class FieldOption:
    """An option declared without its default: :func:`option_group` takes it from the field of
    the group's dataclass that the option fills, so the default is written once."""

    decls: tuple[str, ...]
    kwargs: dict[str, Any]

    def decorator(self, cls: type) -> Callable:
        """``click.option`` with the default of ``cls``'s field, shown in ``--help`` unless it is
        None, a flag's or empty (``show_default`` among the keywords overrides that)."""
        name = click.Option(self.decls).name
        default = {f.name: f.default for f in dataclasses.fields(cls)}[name]
        shown = default is not None and not isinstance(default, bool) and default != ()
        return click.option(
            *self.decls, **{"default": default, "show_default": shown, **self.kwargs}
        )


def field_option(*decls: str, **kwargs: Any) -> FieldOption:
    """Like ``click.option`` in an :func:`option_group`, but with the default of the group's
    dataclass field (see :class:`FieldOption`)."""
    return FieldOption(decls, kwargs)


warmup_option = field_option("--warmup", type=click.IntRange(0), help="Untimed runs first.")
"""``--warmup``: untimed runs before the timed ones (the default is the group's)."""


def option_group(cls: type, name: str, *options: Callable | FieldOption) -> Callable:
    """A decorator that adds ``options`` to a command and passes their values as one ``cls``
    instance, the keyword argument ``name``; the fields of ``cls`` that no option fills keep their
    defaults (so a library's own options dataclass can be the group).

    Options that expose no value (a callback does their work) may be among ``options``; those made
    with :func:`field_option` take their default from ``cls``.
    """
    names = [f.name for f in dataclasses.fields(cls)]
    decorators = [o.decorator(cls) if isinstance(o, FieldOption) else o for o in options]

    def decorate(f: Callable) -> Callable:
        @functools.wraps(f)
        def command(*args: Any, **kw: Any) -> Any:
            kw[name] = cls(**{k: kw.pop(k) for k in names if k in kw})
            return f(*args, **kw)

        return functools.reduce(lambda acc, o: o(acc), reversed(decorators), command)

    return decorate


# -q and --debug ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Verbosity:
    """``-q``: no progress bar or tables; ``--debug``: full tracebacks (as the group's flag)."""

    quiet: bool = False
    debug: bool = False


def _debug(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    from edgesplit.cli.main import debug_enabled

    if value and not ctx.resilient_parsing:
        os.environ["EDGESPLIT_DEBUG"] = "1"
    return value or debug_enabled()


verbosity_options = option_group(
    Verbosity,
    "verbosity",
    click.option("--quiet", "-q", is_flag=True, help="No progress bar or tables."),
    click.option(
        "--debug",
        is_flag=True,
        callback=_debug,
        help="Show full tracebacks (or set EDGESPLIT_DEBUG=1).",
    ),
)


# --input-shape and --input ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelInputs:
    """``--input-shape NAME=D1,D2,...`` and ``--input NAME=FILE.npy`` as given."""

    input_shapes: tuple[str, ...] = ()
    input_values: tuple[str, ...] = ()

    def parsed(self) -> dict:
        """``input_shapes`` and ``input_values`` parsed (None where none was given)."""
        from edgesplit.cli.common import model_inputs

        return model_inputs(self.input_shapes, self.input_values)


model_input_options = option_group(ModelInputs, "inputs", input_shape_option, input_values_option)


def model_device_options(f: Callable) -> Callable:
    """MODEL, ``--device``, ``--input-shape`` and ``--input`` (as :class:`ModelInputs` named
    ``inputs``) and the stages' time limits: what a command that reads a model for a device takes
    (profile, partition, deploy)."""
    for decorator in (stage_limit_options, model_input_options, device_option, model_argument):
        f = decorator(f)
    return f


# the server a plan may use and the link to it --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ServerLinkFlags:
    """``--server``, ``--server-profile``, ``--link``, ``--bandwidth-mbps`` and ``--rtt-ms``, named
    as the fields of :class:`Choices` they fill."""

    server: str | None = None
    server_profile: str | None = None
    link: str | None = None
    bandwidth_mbps: float | None = None
    rtt_ms: float | None = None


server_link_options = option_group(
    ServerLinkFlags,
    "server_link",
    click.option("--server", help="A server spec whose processors may take parts."),
    file_option(
        "--server-profile",
        help="A profile of MODEL measured on the server (edgesplit profile MODEL --device SERVER, "
        "run there): prices the server's processors instead of its spec's roofline.",
    ),
    click.option("--link", help="Network preset from devices/links.yaml (wifi, lte, 5g ...)."),
    click.option(
        "--bandwidth-mbps",
        type=FiniteFloat(minimum=0, open_min=True),
        help="Network bandwidth, up and down (overrides the preset).",
    ),
    click.option(
        "--rtt-ms",
        type=FiniteFloat(minimum=0),
        help="Network round-trip time (overrides the preset).",
    ),
)


# the accuracy budget of reduced-precision parts --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BudgetFlags:
    """``--min-snr-db``, ``--min-top1-agreement`` and ``--max-accuracy-drop``: the fields of the
    :class:`~edgesplit.precision.metrics.AccuracyBudget` that int8 and fp16 parts must meet."""

    min_snr_db: float | None = None
    min_top1_agreement: float | None = None
    max_accuracy_drop: float | None = None

    def given(self) -> AccuracyBudget | None:
        """The budget given (None when no flag is: the default budget applies)."""
        from edgesplit.precision.metrics import AccuracyBudget

        return AccuracyBudget(**vars(self)) if self != BudgetFlags() else None


budget_options = option_group(
    BudgetFlags,
    "budget",
    field_option(
        "--min-snr-db",
        type=click.FloatRange(-200, 200),
        help="Least SNR of every output against fp32, in dB.",
    ),
    field_option(
        "--min-top1-agreement",
        type=click.FloatRange(0, 1),
        help="Least share of samples whose top-1 class is fp32's (classifiers, 0-1).",
    ),
    field_option(
        "--max-accuracy-drop",
        type=click.FloatRange(0, 1),
        help="Largest accuracy drop against fp32: top-1 classes changed, or relative RMS error "
        "(0-1).",
    ),
)


def calibration_options() -> list[Callable]:
    """``--calibration-data`` and ``--calibration-method``: the data int8 parts are calibrated and
    every reduced-precision part is measured on, and how int8 ranges are found."""
    from edgesplit.precision import CALIBRATION_METHODS, DEFAULT_CALIBRATION_METHOD

    return [
        click.option(
            "--calibration-data",
            type=click.Path(),
            help="An .npz of arrays named after the inputs, or a folder of .npy files, to "
            "calibrate int8 parts and measure accuracy on (default: photographs for a vision "
            "model, else synthetic).",
        ),
        click.option(
            "--calibration-method",
            type=click.Choice(CALIBRATION_METHODS),
            help="How int8 activation ranges are found from the calibration data: minmax "
            "(extremes), percentile (99.999th), entropy (KL divergence); default "
            f"{DEFAULT_CALIBRATION_METHOD}.",
        ),
    ]


# what a plan is made from: the fields of Choices ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """The options ``partition`` and ``deploy`` build their :class:`Choices` from."""

    profile_path: str | None = None
    backends: tuple[str, ...] = ()
    runs: int = 20
    objective: str = "latency"
    split_operators: bool = False
    slo_ms: float | None = None
    server_link: ServerLinkFlags = ServerLinkFlags()
    pins: tuple[str, ...] = ()
    server_load: int | None = None
    server_slots: int = 1
    budget: BudgetFlags = BudgetFlags()
    calibration_data: str | None = None
    calibration_method: str | None = None

    def choices(self, inputs: ModelInputs) -> Choices:
        """The one place the command line becomes a :class:`Choices`: the flags named as its
        fields are copied as they are."""
        from edgesplit.profile.options import ProfileOptions
        from edgesplit.util import known_fields
        from edgesplit.workflows.resolve import Choices

        given = known_fields(Choices, vars(self) | vars(self.server_link)) | inputs.parsed()
        return Choices(
            **given,
            profile=self.profile_path,
            profiling=ProfileOptions(self.backends, runs=self.runs),
            accuracy=self.budget.given(),
        )


server_load_options = [
    field_option(
        "--server-load",
        type=click.IntRange(min=1),
        metavar="N",
        help="Price server parts as if N devices share the server (closed-loop queueing delay); a "
        "crowded server pushes work back onto the device. Needs --server.",
    ),
    field_option(
        "--server-slots",
        type=click.IntRange(min=1),
        help="Requests the server computes at once, for --server-load.",
    ),
]


def plan_options(profile_help: str) -> Callable:
    """The options of :class:`PlanOptions` (``--profile`` with this command's help)."""
    profile = file_option("--profile", "profile_path", help=profile_help)
    return option_group(
        PlanOptions,
        "plan",
        profile,
        backend_option,
        runs_option,
        objective_option,
        split_option,
        slo_option,
        server_link_options,
        pin_option,
        *server_load_options,
        budget_options,
        *calibration_options(),
    )


# a bundle: where it goes, how it is built, whether it is verified -------------------------------


@dataclasses.dataclass(frozen=True)
class BundleOutput:
    """``-o DIR``, ``--force`` and ``--sign-key``."""

    output: str
    force: bool = False
    sign_key: str | None = None


def bundle_output_options(output_help: str) -> Callable:
    """``-o`` (required, with this command's help), ``--force`` and ``--sign-key``."""
    from edgesplit.cli.common import force_option, output_folder_option, sign_key_option

    output = output_folder_option(output_help)
    return option_group(BundleOutput, "bundle", output, force_option, sign_key_option)


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """How parts are built (tuning, bands) and how a plan is verified, if it is."""

    tune_trials: int = 0
    no_bands: bool = False
    verify_budget_s: float = 30.0
    server_url: str | None = None
    token: str | None = None
    tune_trials_per_task: int = 0

    def tune(self) -> TuneOptions | None:
        """The per-kernel tuning asked for (None: --tune-trials-per-task not given)."""
        if not self.tune_trials_per_task:
            return None
        from edgesplit.backends.tvm.tune import TuneOptions

        return TuneOptions(
            trials_per_task=self.tune_trials_per_task, max_trials=self.tune_trials or None
        )

    def verify_options(self) -> VerifyOptions:
        """``--verify-budget-s``, ``--server-url`` and ``--token`` as :class:`VerifyOptions`."""
        from edgesplit.workflows.deploy import verify_options_for

        return verify_options_for(self.verify_budget_s, self.server_url, self.token)


def build_options(tune_trials_help: str, *between: Callable) -> Callable:
    """``--tune-trials`` (with this command's help), ``--no-bands``, ``between`` (the command's
    own flags), the verification options and ``--tune-trials-per-task``."""
    return option_group(
        BuildOptions,
        "build",
        click.option(
            "--no-bands",
            is_flag=True,
            help="With a server: do not add a plan per bandwidth band (the bundle runs the one "
            "plan).",
        ),
        field_option("--tune-trials", type=click.IntRange(0), help=tune_trials_help),
        *between,
        field_option(
            "--verify-budget-s",
            type=click.FloatRange(min=0, min_open=True),
            help="The most time verification may spend measuring.",
        ),
        field_option(
            "--server-url",
            metavar="URL|local",
            help="Offload server for candidates with server parts while verifying (local: serve "
            "them from this process); without one they are skipped.",
        ),
        field_option(
            "--token", envvar="EDGESPLIT_TOKEN", help="Bearer token for the offload server."
        ),
        field_option(
            "--tune-trials-per-task",
            type=click.IntRange(0),
            help="Tune each kernel of the TVM parts with up to N trials (kernels a database holds "
            "N of are skipped); --tune-trials caps the total.",
        ),
    )


# batching (serve, export-triton) -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Batching:
    """``--max-batch`` and ``--max-queue-delay-ms``: dynamic batching of a part's requests."""

    max_batch: int = 1
    max_queue_delay_ms: float = 0.0


def batching_options(max_batch_help: str, delay_help: str) -> Callable:
    """``--max-batch`` and ``--max-queue-delay-ms``, with this command's help."""
    return option_group(
        Batching,
        "batching",
        field_option("--max-batch", type=click.IntRange(min=1), help=max_batch_help),
        field_option(
            "--max-queue-delay-ms", type=click.FloatRange(min=0, max=60_000), help=delay_help
        ),
    )


# --remote and how to reach it over SSH (profile, tune, devices detect) ----------------------------


@dataclasses.dataclass(frozen=True)
class RemoteFlags:
    """``--remote USER@HOST[:PORT]`` and the flags that say how to reach it over SSH."""

    remote: str | None = None
    identity: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    accept_new_host_key: bool = False
    remote_python: str = "python3"
    remote_tmpdir: str | None = None
    connect_timeout: float = 15.0
    step_timeout: float = 120.0

    def ssh(self) -> SshOptions:
        """The flags as :class:`edgesplit.profile.ssh.SshOptions` (those named as its fields as
        they are)."""
        from edgesplit.profile.ssh import SshOptions
        from edgesplit.util import known_fields

        return SshOptions(
            **known_fields(SshOptions, vars(self)),
            connect_timeout_s=self.connect_timeout,
            step_timeout_s=self.step_timeout,
        )


_SSH_OPTIONS = (
    file_option(
        "--identity",
        "-i",
        help="Private key file (default: the SSH agent, then ~/.ssh/id_*). No passwords.",
    ),
    field_option("--known-hosts", help="known_hosts file the host key is checked against."),
    click.option(
        "--accept-new-host-key",
        is_flag=True,
        help="Trust and record an unknown host key (a changed key is always refused).",
    ),
    field_option("--remote-python", help="Python interpreter on the remote host."),
    click.option(
        "--remote-tmpdir",
        metavar="DIR",
        help="Where the agent's private folder goes there (default $TMPDIR or /tmp).",
    ),
    field_option(
        "--connect-timeout",
        type=FiniteFloat(minimum=0.1),
        help="Seconds for TCP connect, SSH banner, auth and channel opening, each.",
    ),
    field_option(
        "--step-timeout",
        type=FiniteFloat(minimum=1.0),
        help="Seconds the remote agent may stay silent before we give up.",
    ),
)


def remote_options(remote_help: str) -> Callable:
    """``--remote`` (with this command's help) and the SSH flags, as one :class:`RemoteFlags`
    named ``remote``."""
    remote = click.option("--remote", metavar="USER@HOST[:PORT]", help=remote_help)
    return option_group(RemoteFlags, "remote", remote, *_SSH_OPTIONS)


__all__ = [
    "Batching",
    "BudgetFlags",
    "BuildOptions",
    "BundleOutput",
    "ModelInputs",
    "PlanOptions",
    "FieldOption",
    "RemoteFlags",
    "ServerLinkFlags",
    "Verbosity",
    "batching_options",
    "build_options",
    "bundle_output_options",
    "field_option",
    "model_device_options",
    "model_input_options",
    "option_group",
    "plan_options",
    "remote_options",
    "verbosity_options",
    "warmup_option",
]
