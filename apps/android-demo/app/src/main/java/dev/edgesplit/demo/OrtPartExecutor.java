package dev.edgesplit.demo;

import ai.onnxruntime.OnnxJavaType;
import ai.onnxruntime.OnnxTensor;
import ai.onnxruntime.OnnxValue;
import ai.onnxruntime.OrtEnvironment;
import ai.onnxruntime.OrtException;
import ai.onnxruntime.OrtSession;
import ai.onnxruntime.providers.NNAPIFlags;
import android.os.Build;
import dev.edgesplit.core.Bundle;
import dev.edgesplit.core.DType;
import dev.edgesplit.core.EdgesplitException;
import dev.edgesplit.core.LocalPlacement;
import dev.edgesplit.core.Part;
import dev.edgesplit.core.PartExecutor;
import dev.edgesplit.core.Tensor;
import dev.edgesplit.core.TensorSpec;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.EnumSet;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.Map;
import java.util.Optional;

/**
 * Runs a part on this phone with ONNX Runtime, on the execution provider its processor names
 * (see {@link LocalPlacement}). The model bytes come from {@link Bundle#read}, so what ONNX Runtime
 * loads is exactly what was checked against the manifest. When XNNPACK or NNAPI cannot take the
 * part, it runs on the CPU and {@link #note} says why.
 */
final class OrtPartExecutor implements PartExecutor {
    private final OrtEnvironment env;
    private final Part part;
    private final OrtSession session;
    private final OrtSession.SessionOptions options;
    private final String description;
    /** Why the part runs differently from the plan, or "". */
    final String note;

    private OrtPartExecutor(OrtEnvironment env, Part part, OrtSession session, OrtSession.SessionOptions options,
                            String description, String note) {
        this.env = env;
        this.part = part;
        this.session = session;
        this.options = options;
        this.description = description;
        this.note = note;
    }

    static OrtPartExecutor create(OrtEnvironment env, Bundle bundle, Part part, LocalPlacement where)
            throws EdgesplitException {
        byte[] model = bundle.read(where.file);
        String note = where.note;
        LocalPlacement.Ep ep = where.ep;
        if (ep == LocalPlacement.Ep.NNAPI && Build.VERSION.SDK_INT < 27) {
            ep = LocalPlacement.Ep.CPU;
            note = join(note, "NNAPI needs Android 8.1; runs on the CPU");
        }
        OrtSession.SessionOptions so = null;
        try {
            so = options(where, ep);
            return new OrtPartExecutor(env, part, env.createSession(model, so), so, label(ep, where), note);
        } catch (OrtException e) {
            close(so);
            if (ep == LocalPlacement.Ep.CPU) {
                throw new EdgesplitException(EdgesplitException.Kind.LOCAL, "part " + part.name + ": ONNX Runtime cannot load "
                        + where.file + " (" + e.getMessage() + ")", e);
            }
            // The provider refused the model (an operator or type it lacks): the CPU runs everything.
            note = join(note, ep.label + " could not take " + where.file + " (" + e.getMessage() + "); runs on the CPU");
            so = null;
            try {
                so = options(where, LocalPlacement.Ep.CPU);
                return new OrtPartExecutor(env, part, env.createSession(model, so), so,
                        label(LocalPlacement.Ep.CPU, where), note);
            } catch (OrtException cpu) {
                close(so);
                throw new EdgesplitException(EdgesplitException.Kind.LOCAL, "part " + part.name
                        + ": ONNX Runtime cannot load " + where.file + " (" + cpu.getMessage() + ")", cpu);
            }
        }
    }

    private static OrtSession.SessionOptions options(LocalPlacement where, LocalPlacement.Ep ep) throws OrtException {
        OrtSession.SessionOptions so = new OrtSession.SessionOptions();
        try {
            if (where.threads != null && where.threads > 0) {
                so.setIntraOpNumThreads(ep == LocalPlacement.Ep.XNNPACK ? 1 : where.threads);
            }
            if (ep == LocalPlacement.Ep.XNNPACK) {
                so.addXnnpack(where.options);
            } else if (ep == LocalPlacement.Ep.NNAPI) {
                EnumSet<NNAPIFlags> flags = EnumSet.noneOf(NNAPIFlags.class);
                for (NNAPIFlags f : NNAPIFlags.values()) {
                    String v = where.options.get(f.name());
                    if (v != null && (v.equals("1") || v.equalsIgnoreCase("true"))) {
                        flags.add(f);
                    }
                }
                so.addNnapi(flags);
            }
            return so;
        } catch (OrtException | RuntimeException e) {
            so.close();
            throw e;
        }
    }

    private static String label(LocalPlacement.Ep ep, LocalPlacement where) {
        return "ORT " + ep.label + " on " + where.processor;
    }

    private static String join(String a, String b) {
        return a.isEmpty() ? b : a + "; " + b;
    }

    private static void close(OrtSession.SessionOptions so) {
        if (so != null) {
            so.close();
        }
    }

    @Override
    public Map<String, Tensor> run(Map<String, Tensor> inputs) throws EdgesplitException {
        Map<String, OnnxTensor> feeds = new LinkedHashMap<>();
        try {
            for (Map.Entry<String, Tensor> e : inputs.entrySet()) {
                Tensor t = e.getValue();
                feeds.put(e.getKey(), OnnxTensor.createTensor(env, nativeBuffer(t), t.shape(), javaType(t.dtype)));
            }
            Map<String, Tensor> out = new LinkedHashMap<>();
            try (OrtSession.Result r = session.run(feeds, new LinkedHashSet<>(part.outputNames()))) {
                for (TensorSpec spec : part.outputs) {
                    Optional<OnnxValue> v = r.get(spec.name);
                    if (!v.isPresent() || !(v.get() instanceof OnnxTensor)) {
                        throw new EdgesplitException(EdgesplitException.Kind.LOCAL, "ONNX Runtime gave no tensor '"
                                + spec.name + "'");
                    }
                    OnnxTensor y = (OnnxTensor) v.get();
                    long[] shape = y.getInfo().getShape();
                    out.put(spec.name, Tensor.ofBytes(spec.dtype, shape, littleEndian(y.getByteBuffer(), spec.dtype)));
                }
            }
            return out;
        } catch (OrtException e) {
            throw new EdgesplitException(EdgesplitException.Kind.LOCAL, "ONNX Runtime failed: " + e.getMessage(), e);
        } finally {
            for (OnnxTensor t : feeds.values()) {
                t.close();
            }
        }
    }

    /** ORT reads tensors in the platform's byte order from a direct buffer. */
    private static ByteBuffer nativeBuffer(Tensor t) {
        ByteBuffer b = ByteBuffer.allocateDirect(t.nbytes()).order(ByteOrder.nativeOrder());
        if (ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN || t.dtype.itemBytes == 1) {
            b.put(t.buffer());
        } else {
            b.put(swap(t.bytes(), t.dtype.itemBytes));
        }
        b.rewind();
        return b;
    }

    /** {@link OnnxTensor#getByteBuffer()} holds native-order bytes; the core wants little-endian. */
    private static byte[] littleEndian(ByteBuffer b, DType dtype) {
        byte[] raw = new byte[b.remaining()];
        b.get(raw);
        return ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN ? raw : swap(raw, dtype.itemBytes);
    }

    private static byte[] swap(byte[] data, int size) {
        byte[] out = new byte[data.length];
        for (int i = 0; i < data.length; i += size) {
            for (int k = 0; k < size; k++) {
                out[i + k] = data[i + size - 1 - k];
            }
        }
        return out;
    }

    private static OnnxJavaType javaType(DType t) throws EdgesplitException {
        switch (t) {
            case FP32: return OnnxJavaType.FLOAT;
            case FP16: return OnnxJavaType.FLOAT16;
            case FP64: return OnnxJavaType.DOUBLE;
            case INT8: return OnnxJavaType.INT8;
            case UINT8: return OnnxJavaType.UINT8;
            case INT16: return OnnxJavaType.INT16;
            case INT32: return OnnxJavaType.INT32;
            case INT64: return OnnxJavaType.INT64;
            case BOOL: return OnnxJavaType.BOOL;
            default: throw new EdgesplitException(EdgesplitException.Kind.INPUT, t.numpy + " has no ONNX Runtime Java type");
        }
    }

    @Override
    public String describe() {
        return description;
    }

    @Override
    public void close() {
        try {
            session.close();
        } catch (OrtException ignored) {
            // closing twice or after a native failure; nothing left to free
        }
        options.close();
    }
}
