package dev.edgesplit.core;

import static dev.edgesplit.core.Fixtures.shape;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import com.sun.net.httpserver.HttpServer;
import java.io.ByteArrayOutputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.After;
import org.junit.Test;

/**
 * The client's codec, and its errors against small HTTP servers that misbehave on purpose (the
 * real `edgesplit serve` cannot be made to time out or fail with a 5xx on demand). Requests and
 * answers against the real server are in LiveServerTest.
 */
public class OipClientTest {
    private HttpServer server;

    @After
    public void stop() {
        if (server != null) {
            server.stop(0);
        }
    }

    /** A server answering every request with {@code status}, {@code body} after {@code delayMs}. */
    private String serve(final int status, final String contentType, final byte[] body, final long delayMs,
                         final AtomicReference<byte[]> seen, final Map<String, String> headers) throws Exception {
        server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        server.createContext("/", ex -> {
            ByteArrayOutputStream in = new ByteArrayOutputStream();
            byte[] buf = new byte[4096];
            int n;
            while ((n = ex.getRequestBody().read(buf)) > 0) {
                in.write(buf, 0, n);
            }
            if (seen != null) {
                seen.set(in.toByteArray());
                headers.put("hl", ex.getRequestHeaders().getFirst(OipClient.HEADER_LENGTH));
                headers.put("auth", String.valueOf(ex.getRequestHeaders().getFirst("Authorization")));
                headers.put("path", ex.getRequestURI().getPath());
            }
            try {
                Thread.sleep(delayMs);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            ex.getResponseHeaders().set("Content-Type", contentType);
            if (headers != null && headers.containsKey("answer-hl")) {
                ex.getResponseHeaders().set(OipClient.HEADER_LENGTH, headers.get("answer-hl"));
            }
            ex.sendResponseHeaders(status, body.length == 0 ? -1 : body.length);
            try (OutputStream o = ex.getResponseBody()) {
                o.write(body);
            }
        });
        server.start();
        return "http://127.0.0.1:" + server.getAddress().getPort();
    }

    private static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private static Map<String, Tensor> input() throws EdgesplitException {
        Map<String, Tensor> in = new LinkedHashMap<>();
        in.put("x", Tensor.ofFloats(shape(1, 2), 1f, 2f));
        return in;
    }

    @Test
    public void encodesTheBinaryExtension() throws Exception {
        Map<String, Tensor> in = new LinkedHashMap<>();
        in.put("a", Tensor.ofFloats(shape(1, 2), 1f, 2f));
        in.put("ids", Tensor.ofLongs(shape(1), 7));
        OipClient.Body body = OipClient.encodeRequest(in, Arrays.asList("y"));
        Map<?, ?> header = (Map<?, ?>) Json.parse(new String(body.header, StandardCharsets.UTF_8));
        assertEquals(Json.parse("[{\"name\":\"a\",\"datatype\":\"FP32\",\"shape\":[1,2],\"parameters\":{\"binary_data_size\":8}},"
                + "{\"name\":\"ids\",\"datatype\":\"INT64\",\"shape\":[1],\"parameters\":{\"binary_data_size\":8}}]"),
                header.get("inputs"));
        assertEquals(Json.parse("[{\"name\":\"y\",\"parameters\":{\"binary_data\":true}}]"), header.get("outputs"));
        assertEquals(body.header.length + 16, body.length());
        assertArrayEquals(new byte[] {7, 0, 0, 0, 0, 0, 0, 0}, body.tensors.get(1));
        Map<?, ?> all = (Map<?, ?>) Json.parse(new String(OipClient.encodeRequest(in, null).header, StandardCharsets.UTF_8));
        assertEquals(Json.parse("{\"binary_data_output\":true}"), all.get("parameters"));
    }

    private static byte[] response(String header, byte[]... tensors) {
        ByteArrayOutputStream b = new ByteArrayOutputStream();
        byte[] h = utf8(header);
        b.write(h, 0, h.length);
        for (byte[] t : tensors) {
            b.write(t, 0, t.length);
        }
        return b.toByteArray();
    }

    @Test
    public void decodesBinaryAndJsonOutputs() throws Exception {
        String h = "{\"model_name\":\"p1\",\"outputs\":[{\"name\":\"y\",\"datatype\":\"FP32\",\"shape\":[1,2],"
                + "\"parameters\":{\"binary_data_size\":8}},{\"name\":\"k\",\"datatype\":\"INT32\",\"shape\":[2,1],"
                + "\"data\":[[3],[4]]},{\"name\":\"m\",\"datatype\":\"BOOL\",\"shape\":[1],\"parameters\":{\"binary_data_size\":1}}]}";
        byte[] body = response(h, Tensor.ofFloats(shape(1, 2), 5f, 6f).bytes(), new byte[] {1});
        Map<String, Tensor> out = OipClient.decodeResponse(body, utf8(h).length, "/infer");
        assertEquals(Arrays.asList("y", "k", "m"), Arrays.asList(out.keySet().toArray()));
        assertArrayEquals(new float[] {5f, 6f}, out.get("y").toFloats(), 0f);
        assertArrayEquals(new long[] {3, 4}, out.get("k").toLongs());
        assertArrayEquals(new long[] {1}, out.get("m").toLongs());
    }

    @Test
    public void malformedAnswersAreRemoteErrors() {
        String h = "{\"outputs\":[{\"name\":\"y\",\"datatype\":\"FP32\",\"shape\":[1,2],\"parameters\":{\"binary_data_size\":8}}]}";
        int hl = utf8(h).length;
        String[][] cases = {
            {h, "4", "runs past the end of the body"},
            {h, "12", "bytes beyond its outputs"},
            {h.replace("FP32", "BYTES"), "8", "datatype BYTES, which the core does not handle"},
            {h.replace("\"binary_data_size\":8", "\"binary_data_size\":4"), "8", "needs 8 bytes, got 4"},
            {h.replace("[1,2]", "[1,-2]"), "8", "bad shape"},
            {"{\"outputs\": 3}", "0", "'outputs' must be an array"},
            {"{oops", "0", "the JSON header is not valid"},
        };
        for (String[] c : cases) {
            byte[] body = response(c[0], new byte[Integer.parseInt(c[1])]);
            EdgesplitException e = assertThrows(EdgesplitException.class,
                    () -> OipClient.decodeResponse(body, utf8(c[0]).length, "/v2/models/p1/infer"));
            assertEquals(EdgesplitException.Kind.REMOTE, e.kind());
            assertTrue(e.getMessage(), e.getMessage().startsWith("/v2/models/p1/infer: malformed answer: "));
            assertTrue(c[2] + " not in " + e.getMessage(), e.getMessage().contains(c[2]));
        }
        EdgesplitException e = assertThrows(EdgesplitException.class,
                () -> OipClient.decodeResponse(new byte[4], 9, "/infer"));
        assertTrue(e.getMessage().contains("outside the body"));
        assertEquals(hl, utf8(h).length);
    }

    @Test
    public void sendsTokenHeaderLengthAndBytes() throws Exception {
        String h = "{\"outputs\":[{\"name\":\"y\",\"datatype\":\"FP32\",\"shape\":[1],\"parameters\":{\"binary_data_size\":4}}]}";
        AtomicReference<byte[]> seen = new AtomicReference<>();
        Map<String, String> headers = new LinkedHashMap<>();
        headers.put("answer-hl", Integer.toString(utf8(h).length));
        String url = serve(200, "application/octet-stream", response(h, Tensor.ofFloats(shape(1), 9f).bytes()), 0,
                seen, headers);
        OipClient c = new OipClient(url + "/", "tok", 2000, 2000);
        Map<String, Tensor> out = c.infer("p1", input(), Arrays.asList("y"));
        assertArrayEquals(new float[] {9f}, out.get("y").toFloats(), 0f);
        assertEquals("Bearer tok", headers.get("auth"));
        assertEquals("/v2/models/p1/infer", headers.get("path"));
        int hl = Integer.parseInt(headers.get("hl"));
        byte[] req = seen.get();
        assertEquals(hl + 8, req.length);
        Map<?, ?> header = (Map<?, ?>) Json.parse(new String(req, 0, hl, StandardCharsets.UTF_8));
        assertEquals("x", ((Map<?, ?>) ((List<?>) header.get("inputs")).get(0)).get("name"));
        assertArrayEquals(Tensor.ofFloats(shape(1, 2), 1f, 2f).bytes(), Arrays.copyOfRange(req, hl, req.length));
    }

    @Test
    public void serverErrorCarriesItsMessage() throws Exception {
        String url = serve(503, "application/json", utf8("{\"error\": \"model p1 is overloaded\"}"), 0, null, null);
        EdgesplitException e = assertThrows(EdgesplitException.class,
                () -> new OipClient(url, null, 2000, 2000).infer("p1", input(), null));
        assertEquals(EdgesplitException.Kind.REMOTE, e.kind());
        assertEquals(503, e.httpStatus());
        assertEquals(url + "/v2/models/p1/infer: HTTP 503: model p1 is overloaded", e.getMessage());
        assertEquals("Server problem: " + e.getMessage(), e.userMessage());
    }

    @Test
    public void clientErrorWithoutJsonShowsTheText() throws Exception {
        String url = serve(404, "text/plain", utf8("404: Not Found\n"), 0, null, null);
        EdgesplitException e = assertThrows(EdgesplitException.class,
                () -> new OipClient(url, null, 2000, 2000).infer("p9", input(), null));
        assertEquals(404, e.httpStatus());
        assertTrue(e.getMessage(), e.getMessage().endsWith("/v2/models/p9/infer: HTTP 404: 404: Not Found"));
        stop();
        String empty = serve(500, "text/plain", new byte[0], 0, null, null);
        e = assertThrows(EdgesplitException.class, () -> new OipClient(empty, null, 2000, 2000).infer("p1", input(), null));
        assertTrue(e.getMessage(), e.getMessage().endsWith("HTTP 500: server error (no message)"));
    }

    @Test
    public void connectionRefused() throws Exception {
        int port;
        try (ServerSocket s = new ServerSocket(0)) {
            port = s.getLocalPort();
        }
        OipClient c = new OipClient("http://127.0.0.1:" + port, null, 2000, 2000);
        EdgesplitException e = assertThrows(EdgesplitException.class, () -> c.infer("p1", input(), null));
        assertEquals(EdgesplitException.Kind.REMOTE, e.kind());
        assertEquals(0, e.httpStatus());
        assertTrue(e.getMessage(), e.getMessage().startsWith("cannot reach the server at http://127.0.0.1:" + port
                + " (Connection refused"));
        assertTrue(e.getMessage(), e.getMessage().contains("is `edgesplit serve` running there"));
        assertThrows(EdgesplitException.class, c::ready);
    }

    @Test
    public void slowServerTimesOut() throws Exception {
        String url = serve(200, "application/json", utf8("{\"outputs\": []}"), 1200, null, null);
        OipClient c = new OipClient(url, null, 2000, 300);
        long t0 = System.nanoTime();
        EdgesplitException e = assertThrows(EdgesplitException.class, () -> c.infer("p1", input(), null));
        long ms = (System.nanoTime() - t0) / 1_000_000;
        assertEquals(url + "/v2/models/p1/infer: the server did not answer within 300 ms", e.getMessage());
        assertTrue("took " + ms + " ms", ms < 1100);
    }

    @Test
    public void badUrlsAreInputErrors() {
        for (String u : new String[] {"", "localhost:8000", "ftp://host/", "http://"}) {
            EdgesplitException e = assertThrows(EdgesplitException.class, () -> new OipClient(u, null, 1, 1));
            assertEquals(EdgesplitException.Kind.INPUT, e.kind());
            assertTrue(e.getMessage().contains("is not a server URL"));
        }
    }

    @Test
    public void readyFollowsTheHealthEndpoint() throws Exception {
        String url = serve(503, "application/json", utf8("{\"ready\": false}"), 0, null, null);
        assertEquals(false, new OipClient(url, null, 2000, 2000).ready());
    }
}
