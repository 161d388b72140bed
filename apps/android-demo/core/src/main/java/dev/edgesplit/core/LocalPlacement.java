package dev.edgesplit.core;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * How a part runs on the phone with ONNX Runtime for Android: which file to load and which
 * execution provider its processor's {@code provider} maps to. Android-free so the JVM tests
 * cover it; the app turns it into {@code SessionOptions.addXnnpack / addNnapi}.
 *
 * <p>ORT's Android package has the CPU, XNNPACK and NNAPI providers. Others that a device spec may
 * name (QNN, CUDA ...) run on the CPU, and {@link #note} says so; TVM libraries are not loaded by
 * the demo, which runs the part's ONNX model instead.
 *
 * <p>Reduced-precision parts ({@code ort-int8}: a QDQ model; {@code ort-fp16}: a float16 model) are
 * meant for an NPU or DSP. Their provider (QNN's HTP in the spec) maps through {@link #REDUCED}:
 * on ORT's Android package that is NNAPI, which hands a quantized or fp16 graph to the vendor's
 * NPU driver; an app built with {@code onnxruntime-android-qnn} would use QNN itself.
 */
public final class LocalPlacement {
    /** The execution providers of {@code onnxruntime-android}. */
    public enum Ep {
        CPU("CPU"),
        XNNPACK("XNNPACK"),
        NNAPI("NNAPI");

        public final String label;

        Ep(String label) {
            this.label = label;
        }
    }

    public final Ep ep;
    /** The bundle file to load (an ONNX model). */
    public final String file;
    public final String processor;
    /** Provider options for XNNPACK; NNAPI flags ({@code USE_FP16 -> 1}) for NNAPI. */
    public final Map<String, String> options;
    /** Intra-op threads, or null for ORT's default. */
    public final Integer threads;
    /** Why this differs from the plan, or "". */
    public final String note;
    /** The part's precision ({@code fp32}, {@code fp16}, {@code int8}), for the report. */
    public final String precision;

    /** The executor table of reduced-precision parts: precision -> provider on this phone. */
    public static final Map<String, Ep> REDUCED;

    static {
        Map<String, Ep> m = new LinkedHashMap<>();
        m.put("int8", Ep.NNAPI);
        m.put("fp16", Ep.NNAPI);
        REDUCED = Collections.unmodifiableMap(m);
    }

    private LocalPlacement(Ep ep, String file, String processor, Map<String, String> options, Integer threads,
                           String note) {
        this(ep, file, processor, options, threads, note, "fp32");
    }

    private LocalPlacement(Ep ep, String file, String processor, Map<String, String> options, Integer threads,
                           String note, String precision) {
        this.precision = precision;
        this.ep = ep;
        this.file = file;
        this.processor = processor;
        this.options = Collections.unmodifiableMap(options);
        this.threads = threads;
        this.note = note;
    }

    /** Where a device part runs (a remote part gets its fallback from {@link #forFallback}). */
    public static LocalPlacement forPart(Part p) {
        Ep reduced = REDUCED.get(p.precision);
        if (reduced != null && !p.provider.equals("CPUExecutionProvider")) {
            Map<String, String> flags = new LinkedHashMap<>();
            if (p.precision.equals("fp16")) {
                flags.put("USE_FP16", "1");
            }
            String note = p.provider.equals("NnapiExecutionProvider") ? ""
                    : p.precision + " part for " + p.provider + ": runs through " + reduced.label
                    + " (ONNX Runtime's Android package has no " + p.provider + ")";
            return new LocalPlacement(reduced, p.file, p.processor, flags, p.threads, note, p.precision);
        }
        String note = "";
        String file = p.file;
        if (p.backend.equals("tvm")) {
            file = p.onnxFile;
            note = "the demo does not load TVM libraries; runs " + p.onnxFile + " on ORT";
        }
        Ep ep;
        Map<String, String> options = new LinkedHashMap<>(p.providerOptions);
        switch (p.provider) {
            case "CPUExecutionProvider":
                ep = Ep.CPU;
                break;
            case "XnnpackExecutionProvider":
                ep = Ep.XNNPACK;
                if (!options.containsKey("intra_op_num_threads") && p.threads != null) {
                    options.put("intra_op_num_threads", Integer.toString(p.threads));
                }
                break;
            case "NnapiExecutionProvider":
                ep = Ep.NNAPI;
                break;
            default:
                ep = Ep.CPU;
                options.clear();
                note = join(note, p.provider + " is not in ONNX Runtime's Android package; runs on the CPU");
        }
        if (p.backend.equals("tvm")) {
            ep = Ep.CPU;
            options.clear();
        }
        // XNNPACK runs its own thread pool; ORT advises one intra-op thread beside it.
        Integer threads = ep == Ep.XNNPACK ? Integer.valueOf(1) : p.threads;
        return new LocalPlacement(ep, file, p.processor, options, threads, note, p.precision);
    }

    /** Where a remote part's local fallback runs (on the CPU), or null when the part has none. */
    public static LocalPlacement forFallback(Part p) {
        if (p.fallback == null) {
            return null;
        }
        String note = p.fallback.backend.equals("ort") ? ""
                : "fallback backend " + p.fallback.backend + " is not supported by the demo; runs "
                + p.onnxFile + " on ORT";
        String file = p.fallback.backend.equals("ort") ? p.fallback.file : p.onnxFile;
        return new LocalPlacement(Ep.CPU, file, p.fallback.processor, new LinkedHashMap<String, String>(), null, note);
    }

    private static String join(String a, String b) {
        return a.isEmpty() ? b : a + "; " + b;
    }

    /** {@code "ORT XNNPACK on cpu_big"}, {@code "ORT NNAPI int8 on npu"}. */
    public String describe() {
        return "ORT " + ep.label + (precision.equals("fp32") ? "" : " " + precision) + " on " + processor;
    }
}
