package dev.edgesplit.core;

import static dev.edgesplit.core.Fixtures.shape;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.util.Arrays;
import java.util.Collections;
import org.junit.Test;

public class ReportTest {
    @Test
    public void showsModelPlanTimingsAndPredictions() throws Exception {
        Manifest m = Fixtures.parse(Fixtures.diamond());
        String head = Report.header(m);
        assertTrue(head, head.startsWith("Model   diamond (sha256 7f513505c1a8...)\nDevice  snapdragon-8gen2\n"
                + "Plan    4 parts, objective latency, solver manual, server server-a100\n"));
        assertTrue(head, head.contains("p3   server-a100.gpu    server"));
        assertTrue(head, head.contains("after p1, p2"));
        RunResult r = new RunResult(Collections.singletonMap("y", Tensor.ofFloats(shape(1), 1)), Arrays.asList(
                new PartTiming("p0", "cpu_big", "ORT CPU on cpu_big", 0.01, 1.25, 1.5, false, ""),
                new PartTiming("p3", "cpu_big", "ORT CPU on cpu_big", 2.0, 3.5, 1.5, true, "server failed (x)")), 6.0);
        String run = Report.run(m, r);
        assertTrue(run, run.contains("p0   cpu_big            ORT CPU on cpu_big                      0.01      1.25      1.50"));
        assertTrue(run, run.contains("     note: server failed (x)\n"));
        assertTrue(run, run.endsWith("End-to-end 6.00 ms, predicted 4.25 ms; energy predicted 12.50 mJ (not measured here)\n"));
    }

    @Test
    public void topKAndSoftmax() {
        assertArrayEquals(new int[] {2, 0}, Report.topK(new float[] {1f, -1f, 3f}, 2));
        assertArrayEquals(new int[] {0}, Report.topK(new float[] {1f}, 5));
        float[] p = Report.softmax(new float[] {1000f, 1000f});
        assertArrayEquals(new float[] {0.5f, 0.5f}, p, 1e-6f);
    }

    @Test
    public void pictureToNchwWithImagenetNormalisation() throws Exception {
        int red = 0xffff0000;
        int white = 0xffffffff;
        TensorSpec spec = new TensorSpec("input", shape(1, 3, 2, 2), DType.FP32);
        // A 4x4 picture: left half red, right half white, shrunk to 2x2.
        int[] px = new int[16];
        for (int i = 0; i < 16; i++) {
            px[i] = i % 4 < 2 ? red : white;
        }
        float[] v = ImageTensors.fromArgb(px, 4, 4, spec, new float[] {0, 0, 0}, new float[] {1, 1, 1}).toFloats();
        assertArrayEquals(new float[] {1, 1, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1}, v, 1e-6f);
        float[] n = ImageTensors.fromArgb(new int[] {white}, 1, 1, new TensorSpec("i", shape(1, 1, 1, 3), DType.FP32),
                ImageTensors.IMAGENET_MEAN, ImageTensors.IMAGENET_STD).toFloats();
        assertEquals((1 - 0.485f) / 0.229f, n[0], 1e-5f);
        EdgesplitException e = assertThrows(EdgesplitException.class, () -> ImageTensors.fromArgb(px, 4, 4,
                new TensorSpec("ids", shape(1, 16), DType.INT64), ImageTensors.IMAGENET_MEAN, ImageTensors.IMAGENET_STD));
        assertTrue(e.getMessage(), e.getMessage().contains("needs a float32 [1, 3, H, W] or [1, H, W, 3] input"));
    }
}
