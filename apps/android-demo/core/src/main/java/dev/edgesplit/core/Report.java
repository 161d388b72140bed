package dev.edgesplit.core;

import java.util.Locale;

/**
 * The text the demo shows (and the command line prints): model, plan, each part's processor and
 * timing beside the plan's prediction, the end-to-end latency beside the predicted one.
 */
public final class Report {
    private Report() {
    }

    /** Model and plan, before any run. */
    public static String header(Manifest m) {
        StringBuilder b = new StringBuilder();
        b.append("Model   ").append(m.modelName).append(" (sha256 ").append(shortSha(m.modelSha256)).append(")\n");
        b.append("Device  ").append(m.device).append('\n');
        b.append("Plan    ").append(m.planSummary()).append('\n');
        for (Part p : m.parts) {
            b.append(String.format(Locale.ROOT, "  %-4s %-18s %-26s %-5s %s%n", p.name, p.processor,
                    p.remote ? "server" : p.backend + " " + p.provider.replace("ExecutionProvider", ""),
                    p.precision, p.dependsOn.isEmpty() ? "" : "after " + String.join(", ", p.dependsOn)));
        }
        for (String n : m.notes) {
            b.append("  note: ").append(n).append('\n');
        }
        return b.toString();
    }

    /** One run: every part's processor, where it ran, its time and the prediction, then the total. */
    public static String run(Manifest m, RunResult r) {
        StringBuilder b = new StringBuilder();
        b.append(String.format(Locale.ROOT, "%-4s %-18s %-34s %9s %9s %9s%n",
                "part", "processor", "ran on", "start ms", "ms", "predicted"));
        for (PartTiming t : r.parts) {
            b.append(String.format(Locale.ROOT, "%-4s %-18s %-34s %9.2f %9.2f %9s%n", t.part, t.processor,
                    clip(t.ranOn, 34), t.startMs, t.latencyMs, fmt(t.predictedMs)));
            if (!t.note.isEmpty()) {
                b.append("     note: ").append(t.note).append('\n');
            }
        }
        b.append(String.format(Locale.ROOT, "End-to-end %.2f ms, predicted %s ms", r.totalMs,
                fmt(m.predictedLatencyMs())));
        Double e = m.predictedEnergyMj();
        if (e != null) {
            b.append(String.format(Locale.ROOT, "; energy predicted %.2f mJ (not measured here)", e));
        }
        b.append('\n');
        return b.toString();
    }

    /** The indices of the {@code k} largest scores, largest first. */
    public static int[] topK(float[] scores, int k) {
        int n = Math.min(k, scores.length);
        int[] idx = new int[n];
        boolean[] used = new boolean[scores.length];
        for (int j = 0; j < n; j++) {
            int best = -1;
            for (int c = 0; c < scores.length; c++) {
                if (!used[c] && (best < 0 || scores[c] > scores[best])) {
                    best = c;
                }
            }
            used[best] = true;
            idx[j] = best;
        }
        return idx;
    }

    /** Softmax of logits (numerically stable). */
    public static float[] softmax(float[] logits) {
        float max = Float.NEGATIVE_INFINITY;
        for (float v : logits) {
            max = Math.max(max, v);
        }
        double sum = 0;
        float[] out = new float[logits.length];
        for (int c = 0; c < logits.length; c++) {
            out[c] = (float) Math.exp(logits[c] - max);
            sum += out[c];
        }
        for (int c = 0; c < out.length; c++) {
            out[c] /= (float) sum;
        }
        return out;
    }

    private static String fmt(Double v) {
        return v == null ? "-" : String.format(Locale.ROOT, "%.2f", v);
    }

    private static String clip(String s, int n) {
        return s.length() <= n ? s : s.substring(0, n - 3) + "...";
    }

    private static String shortSha(String sha) {
        return sha.length() > 12 ? sha.substring(0, 12) + "..." : sha;
    }
}
