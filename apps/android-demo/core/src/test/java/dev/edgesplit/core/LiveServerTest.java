package dev.edgesplit.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.assertThrows;

import java.io.File;
import java.net.ServerSocket;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.Assume;
import org.junit.BeforeClass;
import org.junit.Test;

/**
 * Against a real {@code edgesplit serve --all-parts} (tests/test_android_core.py starts it and
 * passes these system properties; without them the class is skipped):
 * <ul>
 *   <li>{@code edgesplit.url}, {@code edgesplit.token}: the server;</li>
 *   <li>{@code edgesplit.bundle}: the bundle it serves;</li>
 *   <li>{@code edgesplit.inputs}, {@code edgesplit.expected}: {@code name=file.npy,...} of the model's
 *       inputs and of the Python runtime's outputs for them.</li>
 * </ul>
 */
public class LiveServerTest {
    static String url;
    static String token;
    static Bundle bundle;
    static Map<String, Tensor> inputs;
    static Map<String, Tensor> expected;

    @BeforeClass
    public static void live() throws Exception {
        url = System.getProperty("edgesplit.url");
        Assume.assumeTrue("no -Dedgesplit.url: no server to test against", url != null);
        token = System.getProperty("edgesplit.token");
        bundle = Bundle.open(BundleSource.directory(new File(System.getProperty("edgesplit.bundle"))));
        inputs = npys(System.getProperty("edgesplit.inputs"));
        expected = npys(System.getProperty("edgesplit.expected"));
        System.out.println("LiveServerTest: against " + url);
    }

    static Map<String, Tensor> npys(String spec) throws EdgesplitException {
        Map<String, Tensor> out = new LinkedHashMap<>();
        for (String item : spec.split(",")) {
            int eq = item.indexOf('=');
            out.put(item.substring(0, eq), Npy.read(new File(item.substring(eq + 1))));
        }
        return out;
    }

    static OipClient client(String u, String t) throws EdgesplitException {
        return new OipClient(u, t, 5000, 30000);
    }

    static void assertClose(Map<String, Tensor> want, Map<String, Tensor> got) {
        assertEquals(want.keySet(), got.keySet());
        for (String name : want.keySet()) {
            float[] w = want.get(name).toFloats();
            float[] g = got.get(name).toFloats();
            assertEquals(name, w.length, g.length);
            for (int i = 0; i < w.length; i++) {
                assertEquals(name + "[" + i + "]", w[i], g[i], 1e-5f + 1e-5f * Math.abs(w[i]));
            }
        }
    }

    @Test
    public void theWholePlanOverTheServerEqualsPython() throws Exception {
        OipClient c = client(url, token);
        assertTrue(c.ready());
        try (PlanRunner r = new PlanRunner(bundle.manifest, RemoteExecutor.everyPart(c))) {
            RunResult res = r.run(inputs);
            assertClose(expected, res.outputs);
            for (PartTiming t : res.parts) {
                assertEquals("server " + url, t.ranOn);
            }
            assertClose(expected, r.run(inputs).outputs); // the kept-alive connections serve again
        }
    }

    @Test
    public void eachPartsMetadataMatchesTheManifest() throws Exception {
        OipClient c = client(url, token);
        for (Part p : bundle.manifest.parts) {
            Map<String, Object> meta = c.modelMetadata(p.name);
            assertEquals(p.name, meta.get("name"));
            List<?> ins = (List<?>) meta.get("inputs");
            assertEquals(p.inputs.size(), ins.size());
            for (int k = 0; k < ins.size(); k++) {
                Map<?, ?> t = (Map<?, ?>) ins.get(k);
                TensorSpec s = p.inputs.get(k);
                assertEquals(s.name, t.get("name"));
                assertEquals(s.dtype.oip, t.get("datatype"));
                assertEquals(Json.write(s.shape()), Json.write(t.get("shape")));
            }
        }
    }

    @Test
    public void wrongTokenIs401() throws Exception {
        Part p0 = bundle.manifest.parts.get(0);
        EdgesplitException e = assertThrows(EdgesplitException.class,
                () -> client(url, "not-the-token").infer(p0.name, inputs, null));
        assertEquals(401, e.httpStatus());
        assertTrue(e.getMessage(), e.getMessage().endsWith("/v2/models/" + p0.name + "/infer: HTTP 401: missing or wrong bearer token"));
    }

    @Test
    public void unknownModelIs404WithTheServersMessage() throws Exception {
        EdgesplitException e = assertThrows(EdgesplitException.class,
                () -> client(url, token).infer("no-such-part", inputs, null));
        assertEquals(404, e.httpStatus());
        assertEquals(url + "/v2/models/no-such-part/infer: HTTP 404: no model 'no-such-part'", e.getMessage());
    }

    @Test
    public void wrongShapeIs400WithTheServersMessage() throws Exception {
        Part p0 = bundle.manifest.parts.get(0);
        TensorSpec s = p0.inputs.get(0);
        Map<String, Tensor> bad = new LinkedHashMap<>();
        bad.put(s.name, Tensor.ofFloats(new long[] {1, 2}, 1f, 2f));
        EdgesplitException e = assertThrows(EdgesplitException.class, () -> client(url, token).infer(p0.name, bad, null));
        assertEquals(400, e.httpStatus());
        assertTrue(e.getMessage(), e.getMessage().endsWith("HTTP 400: input '" + s.name + "': shape [1, 2], expected "
                + Arrays.toString(s.shape())));
        assertTrue(e.userMessage().startsWith("Server problem: "));
    }

    @Test
    public void aDeadServerFallsBackToAnotherExecutor() throws Exception {
        String dead;
        try (ServerSocket s = new ServerSocket(0)) {
            dead = "http://127.0.0.1:" + s.getLocalPort();
        }
        final OipClient down = client(dead, token);
        final OipClient up = client(url, token);
        ExecutorProvider p = new ExecutorProvider() {
            @Override
            public PartExecutor primary(Part part) {
                return new RemoteExecutor(down, part);
            }

            @Override
            public PartExecutor fallback(Part part) {
                return new RemoteExecutor(up, part);
            }
        };
        try (PlanRunner r = new PlanRunner(bundle.manifest, p)) {
            RunResult res = r.run(inputs);
            assertClose(expected, res.outputs);
            for (PartTiming t : res.parts) {
                assertTrue(t.fellBack);
                assertEquals("server " + url, t.ranOn);
            }
        }
    }
}
