package dev.edgesplit.core;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A small, strict JSON (RFC 8259) reader and writer.
 *
 * <p>The plain JVM has no JSON library and none can be downloaded where the core is built, so the
 * core carries its own. Values map to Java as: object -> {@code LinkedHashMap<String, Object>} (key
 * order kept), array -> {@code ArrayList<Object>}, string -> {@code String}, number -> {@code Long}
 * when it is an integer that fits, else {@code Double}, true/false -> {@code Boolean}, null -> null.
 * Duplicate keys, trailing commas, comments, NaN and leading zeros are errors.
 */
public final class Json {
    /** Nesting deeper than this is refused (no stack overflow on hostile input). */
    public static final int MAX_DEPTH = 256;

    /** A syntax error, with its 1-based line and column. */
    public static final class ParseException extends Exception {
        private static final long serialVersionUID = 1L;
        public final int line;
        public final int column;

        ParseException(String message, int line, int column) {
            super(message + " at line " + line + ", column " + column);
            this.line = line;
            this.column = column;
        }
    }

    private final String s;
    private int i;

    private Json(String s) {
        this.s = s;
    }

    /** Parses one JSON document (surrounding whitespace allowed, nothing else). */
    public static Object parse(String text) throws ParseException {
        Json p = new Json(text);
        p.ws();
        Object v = p.value(0);
        p.ws();
        if (p.i < p.s.length()) {
            throw p.error("unexpected '" + p.s.charAt(p.i) + "' after the JSON value");
        }
        return v;
    }

    private ParseException error(String message) {
        int line = 1;
        int col = 1;
        for (int k = 0; k < i && k < s.length(); k++) {
            if (s.charAt(k) == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        return new ParseException(message, line, col);
    }

    private void ws() {
        while (i < s.length()) {
            char c = s.charAt(i);
            if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
                return;
            }
            i++;
        }
    }

    private Object value(int depth) throws ParseException {
        if (depth > MAX_DEPTH) {
            throw error("nesting deeper than " + MAX_DEPTH);
        }
        if (i >= s.length()) {
            throw error("unexpected end of input");
        }
        char c = s.charAt(i);
        switch (c) {
            case '{':
                return object(depth);
            case '[':
                return array(depth);
            case '"':
                return string();
            case 't':
                return literal("true", Boolean.TRUE);
            case 'f':
                return literal("false", Boolean.FALSE);
            case 'n':
                return literal("null", null);
            default:
                if (c == '-' || (c >= '0' && c <= '9')) {
                    return number();
                }
                throw error("unexpected '" + c + "'");
        }
    }

    private Object literal(String word, Object v) throws ParseException {
        if (!s.startsWith(word, i)) {
            throw error("invalid literal");
        }
        i += word.length();
        return v;
    }

    private Map<String, Object> object(int depth) throws ParseException {
        Map<String, Object> m = new LinkedHashMap<>();
        i++;
        ws();
        if (i < s.length() && s.charAt(i) == '}') {
            i++;
            return m;
        }
        while (true) {
            ws();
            if (i >= s.length() || s.charAt(i) != '"') {
                throw error("expected a string key");
            }
            int at = i;
            String key = string();
            if (m.containsKey(key)) {
                i = at;
                throw error("duplicate key \"" + key + "\"");
            }
            ws();
            expect(':');
            ws();
            m.put(key, value(depth + 1));
            ws();
            if (i < s.length() && s.charAt(i) == ',') {
                i++;
                continue;
            }
            expect('}');
            return m;
        }
    }

    private List<Object> array(int depth) throws ParseException {
        List<Object> a = new ArrayList<>();
        i++;
        ws();
        if (i < s.length() && s.charAt(i) == ']') {
            i++;
            return a;
        }
        while (true) {
            ws();
            a.add(value(depth + 1));
            ws();
            if (i < s.length() && s.charAt(i) == ',') {
                i++;
                continue;
            }
            expect(']');
            return a;
        }
    }

    private void expect(char c) throws ParseException {
        if (i >= s.length()) {
            throw error("expected '" + c + "' but the input ended");
        }
        if (s.charAt(i) != c) {
            throw error("expected '" + c + "' but found '" + s.charAt(i) + "'");
        }
        i++;
    }

    private String string() throws ParseException {
        i++; // opening quote
        StringBuilder b = new StringBuilder();
        while (true) {
            if (i >= s.length()) {
                throw error("unterminated string");
            }
            char c = s.charAt(i++);
            if (c == '"') {
                return b.toString();
            }
            if (c < 0x20) {
                i--;
                throw error("control character in a string");
            }
            if (c != '\\') {
                b.append(c);
                continue;
            }
            if (i >= s.length()) {
                throw error("unterminated string");
            }
            char e = s.charAt(i++);
            switch (e) {
                case '"': b.append('"'); break;
                case '\\': b.append('\\'); break;
                case '/': b.append('/'); break;
                case 'b': b.append('\b'); break;
                case 'f': b.append('\f'); break;
                case 'n': b.append('\n'); break;
                case 'r': b.append('\r'); break;
                case 't': b.append('\t'); break;
                case 'u':
                    if (i + 4 > s.length()) {
                        throw error("short \\u escape");
                    }
                    int cp = 0;
                    for (int k = 0; k < 4; k++) {
                        int d = Character.digit(s.charAt(i + k), 16);
                        if (d < 0) {
                            throw error("bad \\u escape");
                        }
                        cp = cp * 16 + d;
                    }
                    i += 4;
                    b.append((char) cp);
                    break;
                default:
                    i--;
                    throw error("bad escape '\\" + e + "'");
            }
        }
    }

    private Object number() throws ParseException {
        int start = i;
        if (s.charAt(i) == '-') {
            i++;
        }
        if (i >= s.length() || !Character.isDigit(s.charAt(i))) {
            throw error("bad number");
        }
        if (s.charAt(i) == '0' && i + 1 < s.length() && Character.isDigit(s.charAt(i + 1))) {
            throw error("leading zero in a number");
        }
        digits();
        boolean integral = true;
        if (i < s.length() && s.charAt(i) == '.') {
            integral = false;
            i++;
            if (digits() == 0) {
                throw error("bad number: no digits after '.'");
            }
        }
        if (i < s.length() && (s.charAt(i) == 'e' || s.charAt(i) == 'E')) {
            integral = false;
            i++;
            if (i < s.length() && (s.charAt(i) == '+' || s.charAt(i) == '-')) {
                i++;
            }
            if (digits() == 0) {
                throw error("bad number: no digits in the exponent");
            }
        }
        String text = s.substring(start, i);
        if (integral) {
            try {
                return Long.parseLong(text);
            } catch (NumberFormatException tooBig) {
                // falls through to a double, as JavaScript would read it
            }
        }
        return Double.parseDouble(text);
    }

    private int digits() {
        int n = 0;
        while (i < s.length() && Character.isDigit(s.charAt(i))) {
            i++;
            n++;
        }
        return n;
    }

    // ---- writing

    /** Compact JSON text of a value built from maps, lists, strings, numbers, booleans and null. */
    public static String write(Object v) {
        StringBuilder b = new StringBuilder();
        write(b, v);
        return b.toString();
    }

    private static void write(StringBuilder b, Object v) {
        if (v == null) {
            b.append("null");
        } else if (v instanceof String) {
            quote(b, (String) v);
        } else if (v instanceof Boolean || v instanceof Integer || v instanceof Long) {
            b.append(v);
        } else if (v instanceof Number) {
            double d = ((Number) v).doubleValue();
            if (Double.isNaN(d) || Double.isInfinite(d)) {
                throw new IllegalArgumentException("JSON has no " + d);
            }
            b.append(d == Math.rint(d) && Math.abs(d) < 1e15 ? Long.toString((long) d) : Double.toString(d));
        } else if (v instanceof Map) {
            b.append('{');
            Iterator<? extends Map.Entry<?, ?>> it = ((Map<?, ?>) v).entrySet().iterator();
            while (it.hasNext()) {
                Map.Entry<?, ?> e = it.next();
                quote(b, String.valueOf(e.getKey()));
                b.append(':');
                write(b, e.getValue());
                if (it.hasNext()) {
                    b.append(',');
                }
            }
            b.append('}');
        } else if (v instanceof Iterable) {
            b.append('[');
            Iterator<?> it = ((Iterable<?>) v).iterator();
            while (it.hasNext()) {
                write(b, it.next());
                if (it.hasNext()) {
                    b.append(',');
                }
            }
            b.append(']');
        } else if (v instanceof long[]) {
            b.append('[');
            long[] a = (long[]) v;
            for (int k = 0; k < a.length; k++) {
                b.append(k == 0 ? "" : ",").append(a[k]);
            }
            b.append(']');
        } else {
            throw new IllegalArgumentException("cannot write " + v.getClass().getName() + " as JSON");
        }
    }

    private static void quote(StringBuilder b, String str) {
        b.append('"');
        for (int k = 0; k < str.length(); k++) {
            char c = str.charAt(k);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        b.append('"');
    }
}
