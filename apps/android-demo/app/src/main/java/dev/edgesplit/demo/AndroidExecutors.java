package dev.edgesplit.demo;

import ai.onnxruntime.OrtEnvironment;
import dev.edgesplit.core.Bundle;
import dev.edgesplit.core.EdgesplitException;
import dev.edgesplit.core.ExecutorProvider;
import dev.edgesplit.core.LocalPlacement;
import dev.edgesplit.core.OipClient;
import dev.edgesplit.core.Part;
import dev.edgesplit.core.PartExecutor;
import dev.edgesplit.core.RemoteExecutor;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * The phone's executors: device parts on ONNX Runtime with their processor's provider, server parts
 * over the Open Inference Protocol, and for a server part the bundle's local fallback. With no
 * server URL, server parts run on their fallback from the start.
 */
final class AndroidExecutors implements ExecutorProvider {
    private final OrtEnvironment env;
    private final Bundle bundle;
    private final OipClient server;
    private final List<String> notes = Collections.synchronizedList(new ArrayList<String>());

    /** @param server the offload server, or null to keep every part on the phone */
    AndroidExecutors(OrtEnvironment env, Bundle bundle, OipClient server) {
        this.env = env;
        this.bundle = bundle;
        this.server = server;
    }

    @Override
    public PartExecutor primary(Part part) throws EdgesplitException {
        if (part.remote) {
            if (server != null) {
                return new RemoteExecutor(server, part);
            }
            PartExecutor fb = fallback(part);
            if (fb == null) {
                throw new EdgesplitException(EdgesplitException.Kind.INPUT, "part " + part.name
                        + " runs on the server and has no local fallback: enter the server's URL");
            }
            notes.add(part.name + ": no server URL set; runs on the phone");
            return fb;
        }
        return local(part, LocalPlacement.forPart(part));
    }

    @Override
    public PartExecutor fallback(Part part) throws EdgesplitException {
        LocalPlacement where = LocalPlacement.forFallback(part);
        return where == null ? null : local(part, where);
    }

    private PartExecutor local(Part part, LocalPlacement where) throws EdgesplitException {
        OrtPartExecutor e = OrtPartExecutor.create(env, bundle, part, where);
        if (!e.note.isEmpty()) {
            notes.add(part.name + ": " + e.note);
        }
        return e;
    }

    /** What differs from the plan on this phone (providers it lacks, parts kept local). */
    List<String> notes() {
        synchronized (notes) {
            return new ArrayList<>(notes);
        }
    }
}
