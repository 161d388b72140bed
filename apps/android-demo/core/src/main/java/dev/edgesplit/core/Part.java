package dev.edgesplit.core;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;

/**
 * One part of a bundle, as {@code manifest.json} describes it (see edgesplit/bundle/format.py).
 * Fields keep the manifest's meaning: {@code file} is what the backend runs, {@code onnxFile} the
 * part's ONNX model (always there), {@code fallback} what runs it locally when the server fails.
 */
public final class Part {
    /** The local artifact that stands in for a remote part. */
    public static final class Fallback {
        public final String backend;
        public final String file;
        public final String processor;
        public final String reason;

        Fallback(String backend, String file, String processor, String reason) {
            this.backend = backend;
            this.file = file;
            this.processor = processor;
            this.reason = reason;
        }
    }

    public final String name;
    public final String processor;
    public final String backend;
    public final String file;
    public final String onnxFile;
    public final List<TensorSpec> inputs;
    public final List<TensorSpec> outputs;
    public final List<String> dependsOn;
    public final boolean remote;
    public final String provider;
    public final Map<String, String> providerOptions;
    /** Intra-op threads the plan gives the part, or null. */
    public final Integer threads;
    public final Fallback fallback;
    /** The plan's predicted latency of the part in ms, or null. */
    public final Double predictedMs;
    public final String note;
    /** What {@code file} runs in: {@code fp32}, {@code fp16} or {@code int8} (QDQ). */
    public final String precision;

    /** The backends a bundle may name (edgesplit's executor table, device_schema.BACKENDS). */
    static final List<String> BACKENDS = Collections.unmodifiableList(
            java.util.Arrays.asList("ort", "tvm", "ort-int8", "ort-fp16"));

    private Part(Fields f) {
        name = f.str("name");
        processor = f.str("processor");
        backend = f.str("backend");
        file = f.str("file");
        onnxFile = f.str("onnx_file");
        inputs = specs(f, "inputs");
        outputs = specs(f, "outputs");
        dependsOn = Collections.unmodifiableList(f.strings("depends_on", false));
        remote = f.optBool("remote", false);
        provider = f.optStr("provider", "CPUExecutionProvider");
        providerOptions = Collections.unmodifiableMap(f.stringMap("provider_options"));
        Long t = f.optInteger("threads");
        threads = t == null ? null : (int) (long) t;
        Fields fb = f.obj("fallback", false);
        fallback = fb == null ? null
                : new Fallback(fb.str("backend"), fb.str("file"), fb.str("processor"), fb.optStr("reason", ""));
        predictedMs = f.optNumber("predicted_ms");
        note = f.optStr("note", "");
        precision = f.optStr("precision", "fp32");
        if (!backend.isEmpty() && !BACKENDS.contains(backend)) {
            f.problems.add("'" + f.where + ".backend' is '" + backend + "'; expected one of " + BACKENDS);
        }
    }

    static Part parse(Object v, String where, List<String> problems) {
        return new Part(Fields.of(v, where, problems));
    }

    /** Tensor specs under {@code key}: [{name, shape, dtype}]. */
    static List<TensorSpec> specs(Fields f, String key) {
        List<TensorSpec> out = new ArrayList<>();
        List<Object> l = f.list(key);
        for (int k = 0; k < l.size(); k++) {
            Fields t = Fields.of(l.get(k), f.where.isEmpty() ? key + "[" + k + "]" : f.where + "." + key + "[" + k + "]",
                    f.problems);
            String name = t.str("name");
            List<Object> dims = t.list("shape");
            long[] shape = new long[dims.size()];
            for (int d = 0; d < shape.length; d++) {
                Object x = dims.get(d);
                if (x instanceof Long && (Long) x >= 0) {
                    shape[d] = (Long) x;
                } else {
                    f.problems.add("'" + t.where + ".shape[" + d + "]' must be a non-negative integer (static shapes only), not "
                            + (x instanceof Long ? x : Fields.describe(x)));
                }
            }
            String dt = t.str("dtype");
            DType dtype = DType.fromNumpy(dt);
            if (dtype == null && !dt.isEmpty()) {
                f.problems.add("'" + t.where + ".dtype' is '" + dt + "'; the core handles " + DType.supportedNumpy());
            }
            out.add(new TensorSpec(name, shape, dtype == null ? DType.FP32 : dtype));
        }
        return Collections.unmodifiableList(out);
    }

    /** The spec of the input named {@code tensor}, or null. */
    public TensorSpec input(String tensor) {
        for (TensorSpec t : inputs) {
            if (t.name.equals(tensor)) {
                return t;
            }
        }
        return null;
    }

    /** Names of the outputs, in order. */
    public List<String> outputNames() {
        List<String> out = new ArrayList<>();
        for (TensorSpec t : outputs) {
            out.add(t.name);
        }
        return out;
    }

    @Override
    public String toString() {
        return name + " on " + processor + (remote ? " (server)" : "");
    }
}
