package dev.edgesplit.core;

import static dev.edgesplit.core.Fixtures.shape;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.net.ServerSocket;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.TimeUnit;
import org.junit.Test;

/**
 * The scheduler over the diamond x -> p0 -> a -> (p1 -> b, p2 -> c) -> p3 -> y. Device parts are
 * small Java computations (a = x + 1, b = 2a, c = 3a, y = b + c); p3's server is a real OIP client
 * pointed at a closed port where a test needs the server to fail.
 */
public class PlanRunnerTest {
    interface Fn {
        float[] apply(List<float[]> in) throws Exception;
    }

    /** A device part that computes {@code fn} over its inputs; it records that it ran and was closed. */
    static final class Compute implements PartExecutor {
        final Part part;
        final Fn fn;
        final List<String> log;
        volatile boolean closed;

        Compute(Part part, Fn fn, List<String> log) {
            this.part = part;
            this.fn = fn;
            this.log = log;
        }

        @Override
        public Map<String, Tensor> run(Map<String, Tensor> inputs) throws EdgesplitException {
            List<float[]> in = new ArrayList<>();
            for (TensorSpec t : part.inputs) {
                in.add(inputs.get(t.name).toFloats());
            }
            float[] out;
            try {
                out = fn.apply(in);
            } catch (EdgesplitException e) {
                throw e;
            } catch (Exception e) {
                throw new EdgesplitException(EdgesplitException.Kind.LOCAL, e.toString(), e);
            }
            log.add(part.name);
            return Collections.singletonMap(part.outputs.get(0).name,
                    Tensor.ofFloats(part.outputs.get(0).shape(), out));
        }

        @Override
        public String describe() {
            return "java on " + part.processor;
        }

        @Override
        public void close() {
            closed = true;
        }
    }

    static float[] map(float[] a, float k, float add) {
        float[] o = new float[a.length];
        for (int i = 0; i < a.length; i++) {
            o[i] = a[i] * k + add;
        }
        return o;
    }

    static float[] sum(float[] a, float[] b) {
        float[] o = new float[a.length];
        for (int i = 0; i < a.length; i++) {
            o[i] = a[i] + b[i];
        }
        return o;
    }

    final List<String> log = Collections.synchronizedList(new ArrayList<String>());
    final Map<String, Fn> fns = new HashMap<>();
    final Map<String, Compute> made = new LinkedHashMap<>();
    /** Where p3 runs: null for a Java computation, else this server URL. */
    String serverUrl;
    boolean withFallback = true;

    {
        fns.put("p0", in -> map(in.get(0), 1, 1));
        fns.put("p1", in -> map(in.get(0), 2, 0));
        fns.put("p2", in -> map(in.get(0), 3, 0));
        fns.put("p3", in -> sum(in.get(0), in.get(1)));
    }

    ExecutorProvider provider() {
        return new ExecutorProvider() {
            @Override
            public PartExecutor primary(Part p) throws EdgesplitException {
                if (p.remote && serverUrl != null) {
                    return new RemoteExecutor(new OipClient(serverUrl, null, 1000, 1000), p);
                }
                Compute c = new Compute(p, fns.get(p.name), log);
                made.put(p.name, c);
                return c;
            }

            @Override
            public PartExecutor fallback(Part p) {
                if (!withFallback || p.fallback == null) {
                    return null;
                }
                Compute c = new Compute(p, fns.get(p.name), log);
                made.put(p.name + "/fallback", c);
                return c;
            }
        };
    }

    static Map<String, Tensor> x() throws EdgesplitException {
        return Collections.singletonMap("x", Tensor.ofFloats(shape(1, 4), 0, 1, 2, 3));
    }

    static String closedPort() throws Exception {
        try (ServerSocket s = new ServerSocket(0)) {
            return "http://127.0.0.1:" + s.getLocalPort();
        }
    }

    PlanRunner runner(PlanRunner.Options o) throws Exception {
        return new PlanRunner(Fixtures.parse(Fixtures.diamond()), provider(), o);
    }

    @Test
    public void runsThePlanInDependencyOrder() throws Exception {
        try (PlanRunner r = runner(new PlanRunner.Options())) {
            RunResult res = r.run(x());
            assertArrayEquals(new float[] {5, 10, 15, 20}, res.outputs.get("y").toFloats(), 0f); // 5 (x + 1)
            assertEquals("p0", log.get(0));
            assertEquals("p3", log.get(3));
            assertEquals(Collections.singletonList("y"), new ArrayList<>(res.outputs.keySet()));
            for (PartTiming t : res.parts) {
                assertFalse(t.fellBack);
                assertEquals(1.5, t.predictedMs, 0);
                assertTrue(t.latencyMs >= 0 && t.startMs >= 0);
            }
            PartTiming p3 = res.timing("p3");
            assertTrue(p3.startMs >= res.timing("p1").startMs + res.timing("p1").latencyMs);
            assertTrue(res.totalMs >= p3.startMs + p3.latencyMs);
        }
        for (Compute c : made.values()) {
            assertTrue(c.part.name + " not closed", c.closed);
        }
    }

    @Test
    public void independentPartsRunAtTheSameTime() throws Exception {
        CyclicBarrier both = new CyclicBarrier(2); // p1 and p2 each wait here for the other
        fns.put("p1", in -> {
            both.await(5, TimeUnit.SECONDS);
            return map(in.get(0), 2, 0);
        });
        fns.put("p2", in -> {
            both.await(5, TimeUnit.SECONDS);
            return map(in.get(0), 3, 0);
        });
        try (PlanRunner r = runner(new PlanRunner.Options())) {
            RunResult res = r.run(x());
            assertArrayEquals(new float[] {5, 10, 15, 20}, res.outputs.get("y").toFloats(), 0f);
        }
    }

    @Test
    public void unreachableServerFallsBackThenIsSkipped() throws Exception {
        serverUrl = closedPort();
        try (PlanRunner r = runner(new PlanRunner.Options())) {
            RunResult res = r.run(x());
            assertArrayEquals(new float[] {5, 10, 15, 20}, res.outputs.get("y").toFloats(), 0f);
            PartTiming p3 = res.timing("p3");
            assertTrue(p3.fellBack);
            assertEquals("cpu_big", p3.processor);
            assertEquals("java on server-a100.gpu", p3.ranOn);
            assertTrue(p3.note, p3.note.startsWith("server failed (cannot reach the server at " + serverUrl));
            assertTrue(p3.note, p3.note.endsWith("; ran the local fallback on cpu_big"));
            PartTiming again = r.run(x()).timing("p3");
            assertTrue(again.fellBack);
            assertTrue(again.note, again.note.startsWith("server skipped (it failed "));
        }
    }

    @Test
    public void serverIsRetriedAfterTheWindow() throws Exception {
        serverUrl = closedPort();
        PlanRunner.Options o = new PlanRunner.Options();
        o.serverRetryMs = 0;
        try (PlanRunner r = runner(o)) {
            r.run(x());
            assertTrue(r.run(x()).timing("p3").note.startsWith("server failed"));
        }
    }

    @Test
    public void unreachableServerWithoutFallbackIsAClearError() throws Exception {
        serverUrl = closedPort();
        withFallback = false;
        try (PlanRunner r = runner(new PlanRunner.Options())) {
            EdgesplitException e = assertThrows(EdgesplitException.class, () -> r.run(x()));
            assertEquals(EdgesplitException.Kind.REMOTE, e.kind());
            assertTrue(e.getMessage(), e.getMessage().startsWith("part p3 (server-a100.gpu): cannot reach the server at "));
            assertTrue(e.userMessage().startsWith("Server problem: part p3"));
        }
    }

    @Test
    public void deviceFailureIsNotHiddenByAFallback() throws Exception {
        fns.put("p1", in -> {
            throw new IllegalStateException("NNAPI refused the graph");
        });
        try (PlanRunner r = runner(new PlanRunner.Options())) {
            EdgesplitException e = assertThrows(EdgesplitException.class, () -> r.run(x()));
            assertEquals(EdgesplitException.Kind.LOCAL, e.kind());
            assertEquals("part p1 (java on gpu): java.lang.IllegalStateException: NNAPI refused the graph", e.getMessage());
            assertFalse(log.contains("p3"));
        }
    }

    @Test
    public void aRunNeverHangs() throws Exception {
        fns.put("p2", in -> {
            Thread.sleep(5000);
            return in.get(0);
        });
        PlanRunner.Options o = new PlanRunner.Options();
        o.runTimeoutMs = 300;
        try (PlanRunner r = runner(o)) {
            long t0 = System.nanoTime();
            EdgesplitException e = assertThrows(EdgesplitException.class, () -> r.run(x()));
            assertTrue((System.nanoTime() - t0) / 1e6 < 3000);
            assertEquals("the run did not finish within 300 ms (unfinished parts: p2, p3)", e.getMessage());
        }
    }

    @Test
    public void wrongOutputsAreCaught() throws Exception {
        fns.put("p2", in -> new float[] {1, 2}); // p2 claims [1, 4]
        try (PlanRunner r = runner(new PlanRunner.Options())) {
            EdgesplitException e = assertThrows(EdgesplitException.class, () -> r.run(x()));
            assertTrue(e.getMessage(), e.getMessage().contains("2 values do not fill shape [1, 4]"));
        }
    }

    @Test
    public void inputsAreChecked() throws Exception {
        try (PlanRunner r = runner(new PlanRunner.Options())) {
            EdgesplitException e = assertThrows(EdgesplitException.class, () -> r.run(Collections.<String, Tensor>emptyMap()));
            assertEquals("missing input 'x'; the model takes x", e.getMessage());
            assertEquals(EdgesplitException.Kind.INPUT, e.kind());
            e = assertThrows(EdgesplitException.class,
                    () -> r.run(Collections.singletonMap("x", Tensor.ofFloats(shape(4), 0, 1, 2, 3))));
            assertEquals("model input 'x': shape [4], expected [1, 4]", e.getMessage());
            Map<String, Tensor> extra = new HashMap<>(x());
            extra.put("z", Tensor.ofFloats(shape(1), 1));
            e = assertThrows(EdgesplitException.class, () -> r.run(extra));
            assertEquals("unknown input 'z'; the model takes x", e.getMessage());
        }
    }

    @Test
    public void aPartThatCannotLoadFailsUpFrontAndClosesTheOthers() throws Exception {
        ExecutorProvider broken = new ExecutorProvider() {
            @Override
            public PartExecutor primary(Part p) throws EdgesplitException {
                if (p.name.equals("p2")) {
                    throw new EdgesplitException(EdgesplitException.Kind.LOCAL, "parts/p2.onnx: NNAPI cannot load it");
                }
                return provider().primary(p);
            }

            @Override
            public PartExecutor fallback(Part p) {
                return null;
            }
        };
        EdgesplitException e = assertThrows(EdgesplitException.class,
                () -> new PlanRunner(Fixtures.parse(Fixtures.diamond()), broken, new PlanRunner.Options()));
        assertEquals("parts/p2.onnx: NNAPI cannot load it", e.getMessage());
        assertTrue(made.get("p0").closed && made.get("p1").closed);
    }
}
