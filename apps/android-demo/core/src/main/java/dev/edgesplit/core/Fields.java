package dev.edgesplit.core;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Typed reads from a parsed JSON object that collect every problem instead of stopping at the
 * first, so a malformed manifest is reported in one message. A read that fails records the
 * problem (prefixed with the object's path, e.g. {@code parts[1].inputs[0]}) and returns a
 * harmless default; the caller checks {@link #problems} at the end.
 */
final class Fields {
    final Map<String, Object> map;
    final String where;
    final List<String> problems;

    Fields(Map<String, Object> map, String where, List<String> problems) {
        this.map = map;
        this.where = where;
        this.problems = problems;
    }

    /** The object at {@code where}, or an empty one (and a problem) when {@code v} is not an object. */
    @SuppressWarnings("unchecked")
    static Fields of(Object v, String where, List<String> problems) {
        if (v instanceof Map) {
            return new Fields((Map<String, Object>) v, where, problems);
        }
        problems.add((where.isEmpty() ? "the manifest" : where) + " must be a JSON object");
        return new Fields(Collections.<String, Object>emptyMap(), where, problems);
    }

    private String at(String key) {
        return where.isEmpty() ? key : where + "." + key;
    }

    private Object need(String key, String type) {
        if (!map.containsKey(key)) {
            problems.add("missing '" + at(key) + "' (" + type + ")");
            return null;
        }
        return map.get(key);
    }

    private void wrong(String key, String type, Object v) {
        problems.add("'" + at(key) + "' must be " + type + ", not " + describe(v));
    }

    static String describe(Object v) {
        if (v == null) {
            return "null";
        }
        if (v instanceof String) {
            return "a string";
        }
        if (v instanceof Boolean) {
            return "a boolean";
        }
        if (v instanceof Number) {
            return "a number";
        }
        if (v instanceof Map) {
            return "an object";
        }
        return "an array";
    }

    boolean has(String key) {
        return map.containsKey(key) && map.get(key) != null;
    }

    String str(String key) {
        Object v = need(key, "a string");
        if (v instanceof String) {
            return (String) v;
        }
        if (map.containsKey(key)) {
            wrong(key, "a string", v);
        }
        return "";
    }

    /** A string, or {@code dflt} when the key is absent or null. */
    String optStr(String key, String dflt) {
        return has(key) ? str(key) : dflt;
    }

    long integer(String key) {
        Object v = need(key, "an integer");
        if (v instanceof Long) {
            return (Long) v;
        }
        if (map.containsKey(key)) {
            wrong(key, "an integer", v);
        }
        return 0;
    }

    Long optInteger(String key) {
        return has(key) ? integer(key) : null;
    }

    Double optNumber(String key) {
        if (!has(key)) {
            return null;
        }
        Object v = map.get(key);
        if (v instanceof Number) {
            return ((Number) v).doubleValue();
        }
        wrong(key, "a number", v);
        return null;
    }

    boolean optBool(String key, boolean dflt) {
        if (!has(key)) {
            return dflt;
        }
        Object v = map.get(key);
        if (v instanceof Boolean) {
            return (Boolean) v;
        }
        wrong(key, "true or false", v);
        return dflt;
    }

    List<Object> list(String key) {
        Object v = need(key, "an array");
        if (v instanceof List) {
            @SuppressWarnings("unchecked")
            List<Object> l = (List<Object>) v;
            return l;
        }
        if (map.containsKey(key)) {
            wrong(key, "an array", v);
        }
        return Collections.emptyList();
    }

    List<Object> optList(String key) {
        return has(key) ? list(key) : Collections.emptyList();
    }

    /** A list of strings (every element checked). */
    List<String> strings(String key, boolean required) {
        List<String> out = new ArrayList<>();
        List<Object> l = required ? list(key) : optList(key);
        for (int k = 0; k < l.size(); k++) {
            Object v = l.get(k);
            if (v instanceof String) {
                out.add((String) v);
            } else {
                problems.add("'" + at(key) + "[" + k + "]' must be a string, not " + describe(v));
            }
        }
        return out;
    }

    /** The nested object at {@code key}; absent or null gives null when not required. */
    Fields obj(String key, boolean required) {
        if (!required && !has(key)) {
            return null;
        }
        Object v = need(key, "an object");
        if (v instanceof Map || !map.containsKey(key)) {
            return of(v == null ? Collections.emptyMap() : v, at(key), problems);
        }
        wrong(key, "an object", v);
        return new Fields(Collections.<String, Object>emptyMap(), at(key), problems);
    }

    /** An object whose values are strings (numbers and booleans are written as JSON text). */
    Map<String, String> stringMap(String key) {
        Map<String, String> out = new LinkedHashMap<>();
        Fields f = obj(key, false);
        if (f == null) {
            return out;
        }
        for (Map.Entry<String, Object> e : f.map.entrySet()) {
            Object v = e.getValue();
            if (v instanceof String) {
                out.put(e.getKey(), (String) v);
            } else if (v instanceof Number || v instanceof Boolean) {
                out.put(e.getKey(), Json.write(v));
            } else {
                problems.add("'" + f.at(e.getKey()) + "' must be a string, number or boolean, not " + describe(v));
            }
        }
        return out;
    }
}
