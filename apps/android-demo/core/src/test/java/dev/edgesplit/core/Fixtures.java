package dev.edgesplit.core;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Small manifests built in code: a diamond of four parts over a [1, 4] float32 tensor,
 * x -> p0 -> a; a -> p1 -> b; a -> p2 -> c; (b, c) -> p3 -> y, with p3 on the server.
 */
final class Fixtures {
    private Fixtures() {
    }

    static Map<String, Object> spec(String name, String dtype, long... shape) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("name", name);
        List<Object> dims = new ArrayList<>();
        for (long d : shape) {
            dims.add(d);
        }
        m.put("shape", dims);
        m.put("dtype", dtype);
        return m;
    }

    static List<Object> specs(String... names) {
        List<Object> out = new ArrayList<>();
        for (String n : names) {
            out.add(spec(n, "float32", 1, 4));
        }
        return out;
    }

    static Map<String, Object> part(String name, String processor, List<Object> inputs, List<Object> outputs,
                                    List<String> deps, boolean remote) {
        Map<String, Object> p = new LinkedHashMap<>();
        p.put("name", name);
        p.put("processor", processor);
        p.put("backend", "ort");
        p.put("file", "parts/" + name + ".onnx");
        p.put("onnx_file", "parts/" + name + ".onnx");
        p.put("inputs", inputs);
        p.put("outputs", outputs);
        p.put("depends_on", new ArrayList<Object>(deps));
        p.put("remote", remote);
        p.put("provider", "CPUExecutionProvider");
        p.put("provider_options", new LinkedHashMap<String, Object>());
        p.put("target", null);
        p.put("threads", 1L);
        p.put("cores", null);
        p.put("cpu_quota_pct", null);
        Map<String, Object> fb = null;
        if (remote) {
            fb = new LinkedHashMap<>();
            fb.put("backend", "ort");
            fb.put("file", "parts/" + name + ".onnx");
            fb.put("processor", "cpu_big");
            fb.put("reason", "runs locally when the server is unreachable or too slow");
        }
        p.put("fallback", fb);
        p.put("predicted_ms", 1.5);
        p.put("note", "");
        return p;
    }

    /** Part files' contents: a few bytes each (the core never looks inside). */
    static Map<String, byte[]> files() {
        Map<String, byte[]> f = new LinkedHashMap<>();
        for (String n : new String[] {"p0", "p1", "p2", "p3"}) {
            f.put("parts/" + n + ".onnx", ("model bytes of " + n).getBytes(StandardCharsets.UTF_8));
        }
        return f;
    }

    /** The diamond manifest as a JSON-ready map (tests edit it before writing). */
    static Map<String, Object> diamond() {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("model_sha256", "7f513505c1a8d79a63b80506807ebfb87f2009599f0cc359cd4122145c895083");
        m.put("model_name", "diamond");
        m.put("device", "snapdragon-8gen2");
        m.put("inputs", specs("x"));
        m.put("outputs", specs("y"));
        List<Object> parts = new ArrayList<>();
        parts.add(part("p0", "cpu_big", specs("x"), specs("a"), new ArrayList<String>(), false));
        parts.add(part("p1", "gpu", specs("a"), specs("b"), Arrays.asList("p0"), false));
        parts.add(part("p2", "npu", specs("a"), specs("c"), Arrays.asList("p0"), false));
        parts.add(part("p3", "server-a100.gpu", specs("b", "c"), specs("y"), Arrays.asList("p1", "p2"), true));
        m.put("parts", parts);
        Map<String, Object> sums = new LinkedHashMap<>();
        for (Map.Entry<String, byte[]> e : files().entrySet()) {
            sums.put(e.getKey(), Bundle.sha256(e.getValue()));
        }
        m.put("files", sums);
        Map<String, Object> predicted = new LinkedHashMap<>();
        predicted.put("latency_ms", 4.25);
        predicted.put("energy_mj", 12.5);
        Map<String, Object> solver = new LinkedHashMap<>();
        solver.put("name", "manual");
        Map<String, Object> plan = new LinkedHashMap<>();
        plan.put("objective", "latency");
        plan.put("predicted", predicted);
        plan.put("solver", solver);
        m.put("plan", plan);
        m.put("server", "server-a100");
        m.put("notes", new ArrayList<Object>());
        m.put("format_version", 1L);
        return m;
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> part(Map<String, Object> manifest, int k) {
        return (Map<String, Object>) ((List<Object>) manifest.get("parts")).get(k);
    }

    static Manifest parse(Map<String, Object> m) throws EdgesplitException {
        return Manifest.parse(Json.write(m), "manifest.json");
    }

    /** Writes the diamond bundle (manifest and part files) into {@code dir}. */
    static File writeBundle(File dir, Map<String, Object> manifest) throws IOException {
        new File(dir, "parts").mkdirs();
        for (Map.Entry<String, byte[]> e : files().entrySet()) {
            write(new File(dir, e.getKey()), e.getValue());
        }
        write(new File(dir, "manifest.json"), Json.write(manifest).getBytes(StandardCharsets.UTF_8));
        return dir;
    }

    static void write(File f, byte[] data) throws IOException {
        try (OutputStream o = new FileOutputStream(f)) {
            o.write(data);
        }
    }

    static long[] shape(long... d) {
        return d;
    }
}
