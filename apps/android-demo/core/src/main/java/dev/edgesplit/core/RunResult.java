package dev.edgesplit.core;

import java.util.List;
import java.util.Map;

/** The outputs of one run (the model's, in the manifest's order) and how each part ran. */
public final class RunResult {
    public final Map<String, Tensor> outputs;
    /** In the manifest's part order. */
    public final List<PartTiming> parts;
    /** End-to-end latency in ms, from the inputs' check to the last output. */
    public final double totalMs;

    public RunResult(Map<String, Tensor> outputs, List<PartTiming> parts, double totalMs) {
        this.outputs = outputs;
        this.parts = parts;
        this.totalMs = totalMs;
    }

    public PartTiming timing(String part) {
        for (PartTiming t : parts) {
            if (t.part.equals(part)) {
                return t;
            }
        }
        throw new IllegalArgumentException("no part '" + part + "'");
    }
}
