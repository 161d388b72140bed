package dev.edgesplit.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;
import org.junit.Test;

public class LocalPlacementTest {
    private static Part part(String provider, Map<String, Object> options, String backend) throws Exception {
        Map<String, Object> m = Fixtures.diamond();
        Map<String, Object> p = Fixtures.part(m, 1);
        p.put("provider", provider);
        p.put("provider_options", options);
        p.put("threads", 4L);
        if (backend.equals("tvm")) {
            p.put("backend", "tvm");
            p.put("file", "parts/p1.so");
            @SuppressWarnings("unchecked")
            Map<String, Object> files = (Map<String, Object>) m.get("files");
            files.put("parts/p1.so", Bundle.sha256(new byte[0]));
        }
        return Fixtures.parse(m).part("p1");
    }

    @Test
    public void cpuXnnpackAndNnapiMapToTheirProviders() throws Exception {
        LocalPlacement cpu = LocalPlacement.forPart(part("CPUExecutionProvider", Collections.<String, Object>emptyMap(), "ort"));
        assertEquals(LocalPlacement.Ep.CPU, cpu.ep);
        assertEquals(Integer.valueOf(4), cpu.threads);
        assertEquals("", cpu.note);
        assertEquals("ORT CPU on gpu", cpu.describe());

        LocalPlacement x = LocalPlacement.forPart(part("XnnpackExecutionProvider", Collections.<String, Object>emptyMap(), "ort"));
        assertEquals(LocalPlacement.Ep.XNNPACK, x.ep);
        assertEquals("4", x.options.get("intra_op_num_threads")); // XNNPACK's own pool gets the threads
        assertEquals(Integer.valueOf(1), x.threads);

        Map<String, Object> flags = new LinkedHashMap<>();
        flags.put("USE_FP16", 1L);
        LocalPlacement n = LocalPlacement.forPart(part("NnapiExecutionProvider", flags, "ort"));
        assertEquals(LocalPlacement.Ep.NNAPI, n.ep);
        assertEquals("1", n.options.get("USE_FP16"));
        assertEquals("parts/p1.onnx", n.file);
    }

    @Test
    public void qnnAndOthersRunOnTheCpuWithANote() throws Exception {
        Map<String, Object> opts = new LinkedHashMap<>();
        opts.put("backend_path", "libQnnHtp.so");
        LocalPlacement q = LocalPlacement.forPart(part("QNNExecutionProvider", opts, "ort"));
        assertEquals(LocalPlacement.Ep.CPU, q.ep);
        assertTrue(q.options.isEmpty());
        assertEquals("QNNExecutionProvider is not in ONNX Runtime's Android package; runs on the CPU", q.note);
        assertEquals(LocalPlacement.Ep.CPU, LocalPlacement.forPart(part("CUDAExecutionProvider", opts, "ort")).ep);
    }

    @Test
    public void int8PartsForTheNpuRunThroughNnapiAndSayTheirPrecision() throws Exception {
        Map<String, Object> m = Fixtures.diamond();
        Map<String, Object> p = Fixtures.part(m, 2);
        p.put("backend", "ort-int8");
        p.put("precision", "int8");
        p.put("provider", "QNNExecutionProvider");
        p.put("file", "parts/p2.int8.onnx");
        @SuppressWarnings("unchecked")
        Map<String, Object> files = (Map<String, Object>) m.get("files");
        files.put("parts/p2.int8.onnx", Bundle.sha256(new byte[0]));
        Manifest manifest = Fixtures.parse(m);
        LocalPlacement q = LocalPlacement.forPart(manifest.part("p2"));
        assertEquals(LocalPlacement.Ep.NNAPI, q.ep);
        assertEquals("parts/p2.int8.onnx", q.file);
        assertEquals("ORT NNAPI int8 on npu", q.describe());
        assertTrue(q.note, q.note.contains("int8 part for QNNExecutionProvider: runs through NNAPI"));
        assertTrue(Report.header(manifest), Report.header(manifest).contains("ort-int8 QNN"));
        assertTrue(Report.header(manifest), Report.header(manifest).contains(" int8 "));
        assertEquals("fp32", manifest.part("p1").precision);
    }

    @Test
    public void tvmPartsRunTheirOnnxOnOrt() throws Exception {
        LocalPlacement t = LocalPlacement.forPart(part("CPUExecutionProvider", Collections.<String, Object>emptyMap(), "tvm"));
        assertEquals("parts/p1.onnx", t.file);
        assertEquals(LocalPlacement.Ep.CPU, t.ep);
        assertTrue(t.note, t.note.contains("does not load TVM libraries"));
    }

    @Test
    public void fallbackRunsOnTheCpuOfItsProcessor() throws Exception {
        Manifest m = Fixtures.parse(Fixtures.diamond());
        LocalPlacement f = LocalPlacement.forFallback(m.part("p3"));
        assertEquals("parts/p3.onnx", f.file);
        assertEquals("cpu_big", f.processor);
        assertEquals(LocalPlacement.Ep.CPU, f.ep);
        assertNull(LocalPlacement.forFallback(m.part("p0")));
    }
}
