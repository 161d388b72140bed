package dev.edgesplit.core;

/** How one part ran in one request. Times are in ms; {@code startMs} is from the run's start. */
public final class PartTiming {
    public final String part;
    /** The processor that ran it: the planned one, or the fallback's. */
    public final String processor;
    /** The executor's description ({@link PartExecutor#describe()}). */
    public final String ranOn;
    public final double startMs;
    public final double latencyMs;
    /** The plan's prediction for the part, or null. */
    public final Double predictedMs;
    /** True when the server failed (or was skipped) and the local fallback ran the part. */
    public final boolean fellBack;
    /** Why it fell back, or "". */
    public final String note;

    public PartTiming(String part, String processor, String ranOn, double startMs, double latencyMs,
                      Double predictedMs, boolean fellBack, String note) {
        this.part = part;
        this.processor = processor;
        this.ranOn = ranOn;
        this.startMs = startMs;
        this.latencyMs = latencyMs;
        this.predictedMs = predictedMs;
        this.fellBack = fellBack;
        this.note = note;
    }
}
