package dev.edgesplit.core;

import java.util.Map;

/** Runs a part on an Open Inference Protocol server, where the model name is the part's name. */
public final class RemoteExecutor implements PartExecutor {
    private final OipClient client;
    private final Part part;

    public RemoteExecutor(OipClient client, Part part) {
        this.client = client;
        this.part = part;
    }

    @Override
    public Map<String, Tensor> run(Map<String, Tensor> inputs) throws EdgesplitException {
        return client.infer(part.name, inputs, part.outputNames());
    }

    @Override
    public String describe() {
        return "server " + client.url();
    }

    @Override
    public boolean isRemote() {
        return true;
    }

    /** A provider that runs every part on the server (a bundle served with {@code --all-parts}). */
    public static ExecutorProvider everyPart(final OipClient client) {
        return new ExecutorProvider() {
            @Override
            public PartExecutor primary(Part part) {
                return new RemoteExecutor(client, part);
            }

            @Override
            public PartExecutor fallback(Part part) {
                return null;
            }
        };
    }
}
