package dev.edgesplit.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.util.Arrays;
import java.util.List;
import java.util.Map;
import org.junit.Test;

public class JsonTest {
    @Test
    public void parsesEveryKindOfValue() throws Exception {
        Object v = Json.parse(" {\"a\": [1, -2.5, 3e2, true, false, null], \"b\": {\"c\": \"d\"}, \"big\": 12345678901234567890} ");
        Map<?, ?> m = (Map<?, ?>) v;
        assertEquals(Arrays.asList(1L, -2.5, 300.0, true, false, null), m.get("a"));
        assertEquals("d", ((Map<?, ?>) m.get("b")).get("c"));
        assertEquals(1.2345678901234567e19, (Double) m.get("big"), 1e4);
        assertEquals(Arrays.asList("a", "b", "big"), Arrays.asList(m.keySet().toArray()));
    }

    @Test
    public void stringEscapesAndUnicode() throws Exception {
        assertEquals("q\"b\\s/\b\f\n\r\tä€😀",
                Json.parse("\"q\\\"b\\\\s\\/\\b\\f\\n\\r\\t\\u00e4\\u20ac\\ud83d\\ude00\""));
        assertEquals("é", Json.parse("\"é\""));
    }

    @Test
    public void emptyContainersAndNesting() throws Exception {
        assertTrue(((Map<?, ?>) Json.parse("{}")).isEmpty());
        assertTrue(((List<?>) Json.parse("[ ]")).isEmpty());
        assertEquals(Arrays.asList(Arrays.asList(Arrays.asList())), Json.parse("[[[]]]"));
        assertNull(Json.parse("null"));
    }

    @Test
    public void errorsSayWhere() {
        Json.ParseException e = assertThrows(Json.ParseException.class, () -> Json.parse("{\n  \"a\": 1,\n}"));
        assertTrue(e.getMessage(), e.getMessage().contains("line 3"));
        e = assertThrows(Json.ParseException.class, () -> Json.parse("{\"p\": {\"a\": 1, \"a\": 2}}"));
        assertTrue(e.getMessage(), e.getMessage().contains("duplicate key 'a' at $.p.a"));
    }

    @Test
    public void rejectsWhatStrictJsonRejects() {
        // Not here: a raw control character inside a string, which Gson 2.10 accepts even when strict.
        String[] bad = {"", "{", "[1,]", "[1 2]", "{\"a\" 1}", "{\"a\":1,\"a\":2}", "01", "1.", "-", "1e",
            "NaN", "tru", "\"abc", "\"\\x\"", "\"\\u12\"", "[1] x", "{'a': 1}", "// c\n1"};
        for (String s : bad) {
            assertThrows("should reject: " + s, Json.ParseException.class, () -> Json.parse(s));
        }
    }

    @Test
    public void refusesHostileNesting() {
        StringBuilder b = new StringBuilder();
        for (int k = 0; k < 100_000; k++) {
            b.append('[');
        }
        Json.ParseException e = assertThrows(Json.ParseException.class, () -> Json.parse(b.toString()));
        assertTrue(e.getMessage().contains("nesting deeper"));
    }

    @Test
    public void writesAndReadsBack() throws Exception {
        Object v = Json.parse("{\"s\":\"a\\\"b\\n\\u0001\",\"n\":[1,2.5,-3,1e300],\"t\":true,\"z\":null,\"o\":{}}");
        assertEquals(v, Json.parse(Json.write(v)));
        assertEquals("[1,2,3]", Json.write(new long[] {1, 2, 3}));
        assertEquals("{\"k\":4}", Json.write(java.util.Collections.singletonMap("k", 4.0)));
        assertThrows(IllegalArgumentException.class, () -> Json.write(Double.NaN));
    }
}
