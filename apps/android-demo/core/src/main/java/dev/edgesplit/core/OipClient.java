package dev.edgesplit.core;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.ConnectException;
import java.net.HttpRetryException;
import java.net.HttpURLConnection;
import java.net.MalformedURLException;
import java.net.NoRouteToHostException;
import java.net.SocketTimeoutException;
import java.net.URL;
import java.net.UnknownHostException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A client of the Open Inference Protocol v2 REST API (KServe v2 / Triton, as {@code edgesplit
 * serve} answers it) with the binary tensor extension.
 *
 * <p>A request body is a JSON header followed by each input's raw little-endian bytes, in order;
 * the {@code Inference-Header-Content-Length} header gives the JSON header's length and each input
 * carries {@code parameters.binary_data_size}. Outputs are asked for with
 * {@code parameters.binary_data: true}, and the response has the same layout. Outputs the server
 * sends as JSON {@code data} are read too.
 *
 * <p>Uses {@link HttpURLConnection} (Android has no {@code java.net.http}); connections are kept
 * alive and reused. Every failure is an {@link EdgesplitException} of kind REMOTE with one line
 * naming the URL: connection refused, no answer within the timeout, an HTTP error with the
 * server's {@code {"error": ...}} message, or a malformed answer. Thread-safe.
 */
public final class OipClient {
    public static final String HEADER_LENGTH = "Inference-Header-Content-Length";
    /** Answers larger than this are refused (a misbehaving server cannot exhaust memory). */
    public static final int MAX_RESPONSE_BYTES = 512 << 20;

    private final String baseUrl;
    private final String token;
    private final int connectTimeoutMs;
    private final int readTimeoutMs;

    /**
     * @param baseUrl e.g. {@code http://192.168.1.20:8000}
     * @param token the bearer token, or null
     * @param connectTimeoutMs how long to wait for the TCP connection
     * @param readTimeoutMs how long to wait for the server to answer (each read)
     * @throws EdgesplitException (INPUT) when {@code baseUrl} is not an http(s) URL
     */
    public OipClient(String baseUrl, String token, int connectTimeoutMs, int readTimeoutMs)
            throws EdgesplitException {
        String u = baseUrl.trim();
        while (u.endsWith("/")) {
            u = u.substring(0, u.length() - 1);
        }
        try {
            URL url = new URL(u);
            if (!url.getProtocol().equals("http") && !url.getProtocol().equals("https") || url.getHost().isEmpty()) {
                throw new MalformedURLException("not http(s)");
            }
        } catch (MalformedURLException e) {
            throw new EdgesplitException(EdgesplitException.Kind.INPUT,
                    "'" + baseUrl + "' is not a server URL (expected http://HOST:PORT)", e);
        }
        this.baseUrl = u;
        this.token = token == null || token.isEmpty() ? null : token;
        this.connectTimeoutMs = connectTimeoutMs;
        this.readTimeoutMs = readTimeoutMs;
    }

    public String url() {
        return baseUrl;
    }

    /** Whether the server says it is ready ({@code GET /v2/health/ready}: 200 yes, 503 no). */
    public boolean ready() throws EdgesplitException {
        Response r = exchange("GET", "/v2/health/ready", null, true);
        return r.status == 200;
    }

    /** The model's metadata ({@code GET /v2/models/{model}}): name, inputs, outputs. */
    @SuppressWarnings("unchecked")
    public Map<String, Object> modelMetadata(String model) throws EdgesplitException {
        Response r = exchange("GET", "/v2/models/" + model, null, false);
        Object doc = parseJson(r.body, 0, r.body.length, "/v2/models/" + model);
        if (!(doc instanceof Map)) {
            throw malformed("/v2/models/" + model, "the metadata is not a JSON object");
        }
        return (Map<String, Object>) doc;
    }

    /**
     * Runs {@code model} on the server ({@code POST /v2/models/{model}/infer}).
     *
     * @param outputs the outputs to ask for, in order; null for all of them
     * @return output name -> tensor, in the order the server sent them
     */
    public Map<String, Tensor> infer(String model, Map<String, Tensor> inputs, List<String> outputs)
            throws EdgesplitException {
        String path = "/v2/models/" + model + "/infer";
        Response r = exchange("POST", path, encodeRequest(inputs, outputs), false);
        return decodeResponse(r.body, r.headerLength, path);
    }

    // ---- the binary extension

    /** A request body: the JSON header, then the tensors' bytes. */
    static final class Body {
        final byte[] header;
        final List<byte[]> tensors;

        Body(byte[] header, List<byte[]> tensors) {
            this.header = header;
            this.tensors = tensors;
        }

        long length() {
            long n = header.length;
            for (byte[] t : tensors) {
                n += t.length;
            }
            return n;
        }
    }

    static Body encodeRequest(Map<String, Tensor> inputs, List<String> outputs) {
        Map<String, Object> header = new LinkedHashMap<>();
        List<Object> ins = new ArrayList<>();
        List<byte[]> raw = new ArrayList<>();
        for (Map.Entry<String, Tensor> e : inputs.entrySet()) {
            Tensor t = e.getValue();
            Map<String, Object> d = new LinkedHashMap<>();
            d.put("name", e.getKey());
            d.put("datatype", t.dtype.oip);
            d.put("shape", t.shape());
            d.put("parameters", single("binary_data_size", (long) t.nbytes()));
            ins.add(d);
            raw.add(t.bytes());
        }
        header.put("inputs", ins);
        if (outputs == null) {
            header.put("parameters", single("binary_data_output", Boolean.TRUE));
        } else {
            List<Object> outs = new ArrayList<>();
            for (String name : outputs) {
                Map<String, Object> o = new LinkedHashMap<>();
                o.put("name", name);
                o.put("parameters", single("binary_data", Boolean.TRUE));
                outs.add(o);
            }
            header.put("outputs", outs);
        }
        return new Body(Json.write(header).getBytes(StandardCharsets.UTF_8), raw);
    }

    private static Map<String, Object> single(String k, Object v) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put(k, v);
        return m;
    }

    /**
     * Decodes a response body: JSON header ({@code headerLength} bytes, or all of it when null),
     * then each binary output's bytes in order.
     */
    static Map<String, Tensor> decodeResponse(byte[] body, Integer headerLength, String what)
            throws EdgesplitException {
        int hlen = headerLength == null ? body.length : headerLength;
        if (hlen < 0 || hlen > body.length) {
            throw malformed(what, HEADER_LENGTH + " " + hlen + " is outside the body of " + body.length + " bytes");
        }
        Object doc = parseJson(body, 0, hlen, what);
        List<String> problems = new ArrayList<>();
        Fields f = Fields.of(doc, "", problems);
        List<Object> outs = f.list("outputs");
        if (!problems.isEmpty()) {
            throw malformed(what, problems.get(0));
        }
        Map<String, Tensor> result = new LinkedHashMap<>();
        int offset = hlen;
        for (int k = 0; k < outs.size(); k++) {
            Fields o = Fields.of(outs.get(k), "outputs[" + k + "]", problems);
            String name = o.str("name");
            DType dtype = DType.fromOip(o.str("datatype"));
            List<Object> dims = o.list("shape");
            if (!problems.isEmpty()) {
                throw malformed(what, problems.get(0));
            }
            if (dtype == null) {
                throw malformed(what, "output '" + name + "' has datatype " + o.map.get("datatype")
                        + ", which the core does not handle");
            }
            long[] shape = new long[dims.size()];
            for (int d = 0; d < shape.length; d++) {
                if (!(dims.get(d) instanceof Long) || (Long) dims.get(d) < 0) {
                    throw malformed(what, "output '" + name + "' has a bad shape " + Json.write(dims));
                }
                shape[d] = (Long) dims.get(d);
            }
            Fields params = o.obj("parameters", false);
            Long size = params == null ? null : params.optInteger("binary_data_size");
            if (!problems.isEmpty()) {
                throw malformed(what, problems.get(0));
            }
            Tensor t;
            try {
                if (size != null) {
                    if (size < 0 || offset + size > body.length) {
                        throw malformed(what, "output '" + name + "' runs past the end of the body ("
                                + (offset + size) + " > " + body.length + " bytes)");
                    }
                    byte[] raw = new byte[(int) (long) size];
                    System.arraycopy(body, offset, raw, 0, raw.length);
                    offset += raw.length;
                    t = Tensor.ofBytes(dtype, shape, raw);
                } else {
                    t = Tensor.ofNumbers(dtype, shape, flatten(o.map.get("data"), new ArrayList<>()));
                }
            } catch (EdgesplitException | IllegalArgumentException | ArithmeticException e) {
                throw malformed(what, "output '" + name + "': " + e.getMessage());
            }
            result.put(name, t);
        }
        if (offset != body.length) {
            throw malformed(what, "the body holds " + (body.length - offset) + " bytes beyond its outputs");
        }
        return result;
    }

    private static List<Object> flatten(Object v, List<Object> out) throws EdgesplitException {
        if (v instanceof List) {
            for (Object x : (List<?>) v) {
                flatten(x, out);
            }
        } else if (v == null) {
            throw EdgesplitException.input("neither 'data' nor parameters.binary_data_size");
        } else {
            out.add(v);
        }
        return out;
    }

    private static Object parseJson(byte[] body, int from, int to, String what) throws EdgesplitException {
        try {
            return Json.parse(new String(body, from, to - from, StandardCharsets.UTF_8));
        } catch (Json.ParseException e) {
            throw malformed(what, "the JSON header is not valid (" + e.getMessage() + ")");
        }
    }

    private static EdgesplitException malformed(String what, String why) {
        return new EdgesplitException(EdgesplitException.Kind.REMOTE, what + ": malformed answer: " + why);
    }

    // ---- HTTP

    private static final class Response {
        final int status;
        final byte[] body;
        final Integer headerLength;

        Response(int status, byte[] body, Integer headerLength) {
            this.status = status;
            this.body = body;
            this.headerLength = headerLength;
        }
    }

    private Response exchange(String method, String path, Body body, boolean allow503) throws EdgesplitException {
        String where = baseUrl + path;
        HttpURLConnection c = null;
        boolean connected = false;
        boolean done = false;
        try {
            c = (HttpURLConnection) new URL(where).openConnection();
            c.setConnectTimeout(connectTimeoutMs);
            c.setReadTimeout(readTimeoutMs);
            c.setRequestMethod(method);
            c.setInstanceFollowRedirects(false);
            c.setRequestProperty("Accept", "application/json, application/octet-stream");
            if (token != null) {
                c.setRequestProperty("Authorization", "Bearer " + token);
            }
            if (body != null) {
                c.setDoOutput(true);
                c.setFixedLengthStreamingMode(body.length());
                c.setRequestProperty("Content-Type", "application/octet-stream");
                c.setRequestProperty(HEADER_LENGTH, Integer.toString(body.header.length));
            }
            c.connect();
            connected = true;
            if (body != null) {
                try (OutputStream out = c.getOutputStream()) {
                    out.write(body.header);
                    for (byte[] t : body.tensors) {
                        out.write(t);
                    }
                }
            }
            int status = c.getResponseCode();
            boolean ok = status / 100 == 2 || allow503 && status == 503;
            InputStream in = status < 400 ? c.getInputStream() : c.getErrorStream();
            byte[] data = in == null ? new byte[0] : readLimited(in, where);
            if (!ok) {
                throw new EdgesplitException(EdgesplitException.Kind.REMOTE,
                        where + ": HTTP " + status + ": " + errorText(status, data), status, null);
            }
            String hl = c.getHeaderField(HEADER_LENGTH);
            Integer headerLength = null;
            if (hl != null) {
                try {
                    headerLength = Integer.parseInt(hl.trim());
                } catch (NumberFormatException e) {
                    throw malformed(where, HEADER_LENGTH + " is not an integer: " + hl);
                }
            }
            done = true;
            return new Response(status, data, headerLength);
        } catch (HttpRetryException e) {
            // HttpURLConnection in streaming mode cannot replay a request the server challenged.
            int status = e.responseCode();
            throw new EdgesplitException(EdgesplitException.Kind.REMOTE, where + ": HTTP " + status + ": "
                    + (status == 401 ? "missing or wrong bearer token" : e.getReason()), status, e);
        } catch (ConnectException | NoRouteToHostException e) {
            throw new EdgesplitException(EdgesplitException.Kind.REMOTE, "cannot reach the server at " + baseUrl
                    + " (" + reason(e, "connection refused") + "); is `edgesplit serve` running there"
                    + " and listening on this network (--host 0.0.0.0)?", e);
        } catch (SocketTimeoutException e) {
            throw new EdgesplitException(EdgesplitException.Kind.REMOTE, connected
                    ? where + ": the server did not answer within " + readTimeoutMs + " ms"
                    : "cannot reach the server at " + baseUrl + " within " + connectTimeoutMs + " ms", e);
        } catch (UnknownHostException e) {
            throw new EdgesplitException(EdgesplitException.Kind.REMOTE,
                    "cannot reach the server at " + baseUrl + " (unknown host " + e.getMessage() + ")", e);
        } catch (IOException e) {
            throw new EdgesplitException(EdgesplitException.Kind.REMOTE, where + ": request failed ("
                    + e.getClass().getSimpleName() + (e.getMessage() == null ? "" : ": " + e.getMessage()) + ")", e);
        } finally {
            if (c != null && !done) {
                c.disconnect(); // never reuse a connection left in an unknown state
            }
        }
    }

    private static String reason(IOException e, String dflt) {
        return e.getMessage() == null || e.getMessage().isEmpty() ? dflt : e.getMessage();
    }

    private static byte[] readLimited(InputStream in, String where) throws IOException, EdgesplitException {
        try (InputStream s = in) {
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            byte[] buf = new byte[1 << 16];
            int n;
            while ((n = s.read(buf)) > 0) {
                out.write(buf, 0, n);
                if (out.size() > MAX_RESPONSE_BYTES) {
                    throw malformed(where, "the answer is larger than " + MAX_RESPONSE_BYTES + " bytes");
                }
            }
            return out.toByteArray();
        }
    }

    /** The server's {@code {"error": "..."}} message, else the start of the body, else a generic word. */
    static String errorText(int status, byte[] body) {
        String text = new String(body, StandardCharsets.UTF_8).trim();
        try {
            Object doc = Json.parse(text);
            if (doc instanceof Map && ((Map<?, ?>) doc).get("error") instanceof String) {
                return (String) ((Map<?, ?>) doc).get("error");
            }
        } catch (Json.ParseException notJson) {
            // fall through to the raw text
        }
        if (text.isEmpty()) {
            // The JDK drops the body of a 401 in streaming mode; say what 401 means for a bearer API.
            return status == 401 ? "missing or wrong bearer token"
                    : status >= 500 ? "server error (no message)" : "request refused (no message)";
        }
        text = text.replaceAll("\\s+", " ");
        return text.length() > 200 ? text.substring(0, 200) + "..." : text;
    }
}
