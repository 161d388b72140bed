package dev.edgesplit.core;

import com.google.gson.stream.JsonReader;
import com.google.gson.stream.JsonToken;
import com.google.gson.stream.JsonWriter;
import java.io.IOException;
import java.io.StringReader;
import java.io.StringWriter;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * JSON in and out of plain Java values, read and written by Gson's streaming {@link JsonReader}
 * and {@link JsonWriter} (strict, not lenient).
 *
 * <p>Values map to Java as: object -> {@code LinkedHashMap<String, Object>} (key order kept),
 * array -> {@code ArrayList<Object>}, string -> {@code String}, number -> {@code Long} when it is
 * an integer that fits, else {@code Double}, true/false -> {@code Boolean}, null -> null. Gson
 * rejects trailing commas, comments, single quotes, NaN, leading zeros and text after the value
 * (it accepts a raw control character inside a string); on top of it, this class rejects
 * duplicate keys and nesting deeper than {@link #MAX_DEPTH}.
 */
public final class Json {
    /** Nesting deeper than this is refused (no stack overflow on hostile input). */
    public static final int MAX_DEPTH = 256;

    /** Text that is not one valid JSON document; the message says where (Gson's line, column, path). */
    public static final class ParseException extends Exception {
        private static final long serialVersionUID = 1L;

        ParseException(String message, Throwable cause) {
            super(message, cause);
        }
    }

    /** Gson's words for "strict mode refused this", which would send a reader to the wrong fix. */
    private static final String LENIENT_HINT = "Use JsonReader.setLenient(true) to accept malformed JSON";

    private Json() {}

    /** Parses one JSON document (surrounding whitespace allowed, nothing else). */
    public static Object parse(String text) throws ParseException {
        JsonReader r = new JsonReader(new StringReader(text));
        r.setLenient(false);
        try {
            Object v = value(r, 0);
            if (r.peek() != JsonToken.END_DOCUMENT) {
                throw new ParseException("unexpected text after the JSON value " + where(r), null);
            }
            return v;
        } catch (IOException | IllegalStateException | NumberFormatException e) {
            // Gson: MalformedJsonException or EOFException (IOException), a bad \\u escape
            // (NumberFormatException), a token where another was expected (IllegalStateException).
            String message = e.getMessage() == null ? e.getClass().getSimpleName() : e.getMessage();
            throw new ParseException(message.replace(LENIENT_HINT, "malformed JSON"), e);
        }
    }

    private static String where(JsonReader r) {
        return "at " + r.getPath();
    }

    private static Object value(JsonReader r, int depth) throws IOException, ParseException {
        JsonToken token = r.peek();
        switch (token) {
            case BEGIN_OBJECT:
                return object(r, depth + 1);
            case BEGIN_ARRAY:
                return array(r, depth + 1);
            case STRING:
                return r.nextString();
            case NUMBER:
                return number(r.nextString());
            case BOOLEAN:
                return r.nextBoolean();
            case NULL:
                r.nextNull();
                return null;
            default:
                throw new ParseException("expected a value, got " + token + " " + where(r), null);
        }
    }

    private static Map<String, Object> object(JsonReader r, int depth) throws IOException, ParseException {
        checkDepth(r, depth);
        Map<String, Object> out = new LinkedHashMap<>();
        r.beginObject();
        while (r.hasNext()) {
            String key = r.nextName();
            if (out.containsKey(key)) {
                throw new ParseException("duplicate key '" + key + "' " + where(r), null);
            }
            out.put(key, value(r, depth));
        }
        r.endObject();
        return out;
    }

    private static List<Object> array(JsonReader r, int depth) throws IOException, ParseException {
        checkDepth(r, depth);
        List<Object> out = new ArrayList<>();
        r.beginArray();
        while (r.hasNext()) {
            out.add(value(r, depth));
        }
        r.endArray();
        return out;
    }

    private static void checkDepth(JsonReader r, int depth) throws ParseException {
        if (depth > MAX_DEPTH) {
            throw new ParseException("nesting deeper than " + MAX_DEPTH + " " + where(r), null);
        }
    }

    /** A Long for an integer literal that fits, else a Double (as JavaScript would read it). */
    private static Object number(String literal) {
        boolean integral = literal.indexOf('.') < 0 && literal.indexOf('e') < 0 && literal.indexOf('E') < 0;
        if (integral) {
            try {
                return Long.parseLong(literal);
            } catch (NumberFormatException tooBig) {
                // falls through to a double
            }
        }
        return Double.parseDouble(literal);
    }

    // ---- writing

    /**
     * Compact JSON text of a value built from maps, lists, strings, numbers, booleans, null and
     * {@code long[]}. Integral doubles below 1e15 are written as integers ({@code 4.0} -> {@code 4}).
     *
     * @throws IllegalArgumentException for NaN, infinities and values of other types
     */
    public static String write(Object v) {
        StringWriter out = new StringWriter();
        try (JsonWriter w = new JsonWriter(out)) {
            w.setSerializeNulls(true);
            write(w, v);
        } catch (IOException e) {
            throw new IllegalStateException("writing to a string failed", e); // a StringWriter does not
        }
        return out.toString();
    }

    private static void write(JsonWriter w, Object v) throws IOException {
        if (v == null) {
            w.nullValue();
        } else if (v instanceof String) {
            w.value((String) v);
        } else if (v instanceof Boolean) {
            w.value((Boolean) v);
        } else if (v instanceof Integer || v instanceof Long) {
            w.value(((Number) v).longValue());
        } else if (v instanceof Number) {
            double d = ((Number) v).doubleValue();
            if (Double.isNaN(d) || Double.isInfinite(d)) {
                throw new IllegalArgumentException("JSON has no " + d);
            }
            if (d == Math.rint(d) && Math.abs(d) < 1e15) {
                w.value((long) d);
            } else {
                w.value(d);
            }
        } else if (v instanceof Map) {
            w.beginObject();
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                w.name(String.valueOf(e.getKey()));
                write(w, e.getValue());
            }
            w.endObject();
        } else if (v instanceof Iterable) {
            w.beginArray();
            for (Object item : (Iterable<?>) v) {
                write(w, item);
            }
            w.endArray();
        } else if (v instanceof long[]) {
            w.beginArray();
            for (long x : (long[]) v) {
                w.value(x);
            }
            w.endArray();
        } else {
            throw new IllegalArgumentException("cannot write " + v.getClass().getName() + " as JSON");
        }
    }
}
