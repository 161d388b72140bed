package dev.edgesplit.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.util.Arrays;
import java.util.List;
import java.util.Map;
import org.junit.Test;

public class ManifestTest {
    private static EdgesplitException fails(Map<String, Object> m) {
        EdgesplitException e = assertThrows(EdgesplitException.class, () -> Fixtures.parse(m));
        assertEquals(EdgesplitException.Kind.BUNDLE, e.kind());
        assertTrue(e.userMessage(), e.userMessage().startsWith("Bundle problem: manifest.json: "));
        return e;
    }

    private static void contains(EdgesplitException e, String... parts) {
        for (String p : parts) {
            assertTrue("'" + p + "' not in: " + e.getMessage(), e.getMessage().contains(p));
        }
    }

    @Test
    public void readsTheDiamond() throws Exception {
        Manifest m = Fixtures.parse(Fixtures.diamond());
        assertEquals("diamond", m.modelName);
        assertEquals(4, m.parts.size());
        Part p3 = m.part("p3");
        assertTrue(p3.remote);
        assertEquals(Arrays.asList("p1", "p2"), p3.dependsOn);
        assertEquals("cpu_big", p3.fallback.processor);
        assertEquals(Arrays.asList("y"), p3.outputNames());
        assertEquals(DType.FP32, p3.input("b").dtype);
        assertEquals(1.5, p3.predictedMs, 0);
        assertEquals(4.25, m.predictedLatencyMs(), 0);
        assertEquals(12.5, m.predictedEnergyMj(), 0);
        assertEquals("4 parts, objective latency, solver manual, server server-a100", m.planSummary());
        assertNull(m.part("p0").fallback);
    }

    @Test
    public void malformedJsonSaysWhere() {
        EdgesplitException e = assertThrows(EdgesplitException.class,
                () -> Manifest.parse("{\"format_version\": 1,\n \"parts\": [}", "bundle/manifest.json"));
        assertEquals(EdgesplitException.Kind.BUNDLE, e.kind());
        contains(e, "bundle/manifest.json: not a JSON manifest", "line 2");
        e = assertThrows(EdgesplitException.class, () -> Manifest.parse("[1, 2]", "m.json"));
        contains(e, "m.json: the manifest must be a JSON object");
    }

    @Test
    public void otherFormatVersionIsRefusedFirst() {
        Map<String, Object> m = Fixtures.diamond();
        m.put("format_version", 2L);
        m.remove("parts"); // not reported: another version may lay out everything differently
        EdgesplitException e = fails(m);
        assertEquals("manifest.json: manifest format version 2, this app reads 1", e.getMessage());
        m.remove("format_version");
        contains(fails(m), "format version missing");
        m.put("format_version", "1");
        contains(fails(m), "format version \"1\"");
    }

    @Test
    public void missingFieldsAreAllNamed() {
        Map<String, Object> m = Fixtures.diamond();
        m.remove("model_name");
        Fixtures.part(m, 1).remove("file");
        Fixtures.part(m, 2).remove("outputs");
        EdgesplitException e = fails(m);
        contains(e, "malformed manifest", "missing 'model_name' (a string)", "missing 'parts[1].file' (a string)",
                "missing 'parts[2].outputs' (an array)");
    }

    @Test
    public void wrongTypesAreNamed() {
        Map<String, Object> m = Fixtures.diamond();
        Fixtures.part(m, 0).put("remote", "yes");
        Fixtures.part(m, 0).put("threads", 1.5);
        @SuppressWarnings("unchecked")
        Map<String, Object> spec = (Map<String, Object>) ((List<Object>) Fixtures.part(m, 1).get("inputs")).get(0);
        spec.put("dtype", "complex64");
        spec.put("shape", Arrays.asList(1L, "N"));
        m.put("files", Arrays.asList("x"));
        EdgesplitException e = fails(m);
        contains(e, "'parts[0].remote' must be true or false, not a string",
                "'parts[0].threads' must be an integer, not a number",
                "'parts[1].inputs[0].dtype' is 'complex64'; the core handles float32",
                "'parts[1].inputs[0].shape[1]' must be a non-negative integer (static shapes only), not a string",
                "'files' must be an object, not an array");
    }

    @Test
    public void inconsistentPlansAreRefused() {
        Map<String, Object> m = Fixtures.diamond();
        Fixtures.part(m, 3).put("depends_on", Arrays.asList("p1")); // reads c from p2 without waiting for it
        contains(fails(m), "part p3 reads 'c' from p2 but does not depend on it");

        m = Fixtures.diamond();
        Fixtures.part(m, 1).put("depends_on", Arrays.asList("p0", "p9"));
        contains(fails(m), "part p1 depends on unknown part 'p9'");

        m = Fixtures.diamond();
        Fixtures.part(m, 0).put("depends_on", Arrays.asList("p3"));
        Fixtures.part(m, 0).put("inputs", Fixtures.specs("x"));
        contains(fails(m), "cycle");

        m = Fixtures.diamond();
        Fixtures.part(m, 2).put("file", "parts/p2.so");
        contains(fails(m), "part p2 names parts/p2.so, which the manifest has no checksum for");

        m = Fixtures.diamond();
        Fixtures.part(m, 1).put("name", "p2");
        contains(fails(m), "two parts are named 'p2'");

        m = Fixtures.diamond();
        Fixtures.part(m, 1).put("backend", "tflite");
        contains(fails(m), "'parts[1].backend' is 'tflite'; expected one of [ort, tvm, ort-int8, ort-fp16]");
    }

    @Test
    @SuppressWarnings("unchecked")
    public void unsafeFilePathsAndBadDigestsAreRefused() {
        Map<String, Object> m = Fixtures.diamond();
        ((Map<String, Object>) m.get("files")).put("../../etc/passwd", Bundle.sha256(new byte[0]));
        ((Map<String, Object>) m.get("files")).put("/abs/file", Bundle.sha256(new byte[0]));
        ((Map<String, Object>) m.get("files")).put("parts/x.onnx", "ABC");
        contains(fails(m), "file path '../../etc/passwd' leaves the bundle",
                "file path '/abs/file' is not a relative path inside the bundle",
                "files['parts/x.onnx'] is not a lower-case hex sha256");
    }

    @Test
    public void optionalFieldsMayBeAbsentOrNull() throws Exception {
        Map<String, Object> m = Fixtures.diamond();
        m.remove("server");
        m.remove("notes");
        m.put("plan", new java.util.LinkedHashMap<String, Object>());
        Map<String, Object> p = Fixtures.part(m, 0);
        for (String k : new String[] {"depends_on", "remote", "provider", "provider_options", "threads", "fallback",
            "predicted_ms", "note"}) {
            p.remove(k);
        }
        Manifest parsed = Fixtures.parse(m);
        assertNull(parsed.predictedLatencyMs());
        assertEquals("CPUExecutionProvider", parsed.part("p0").provider);
        assertNull(parsed.part("p0").threads);
        assertEquals("4 parts", parsed.planSummary());
    }
}
