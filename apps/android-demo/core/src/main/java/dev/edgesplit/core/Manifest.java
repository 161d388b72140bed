package dev.edgesplit.core;

import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.regex.Pattern;

/**
 * A bundle's {@code manifest.json}, parsed and checked (format version 1, as written by
 * edgesplit/bundle/format.py). Parsing reports every problem it finds in one
 * {@link EdgesplitException} of kind BUNDLE; a manifest that parses is internally consistent:
 * every file a part names has a checksum, every part input has a producer the part depends on,
 * and the parts form an acyclic graph.
 */
public final class Manifest {
    public static final int FORMAT_VERSION = 1;
    private static final Pattern SHA256 = Pattern.compile("[0-9a-f]{64}");

    public final String modelSha256;
    public final String modelName;
    public final String device;
    public final List<TensorSpec> inputs;
    public final List<TensorSpec> outputs;
    /** In the manifest's order, which is a topological order of the part graph. */
    public final List<Part> parts;
    /** Relative path -> sha256 (lower-case hex) of every file in the bundle. */
    public final Map<String, String> files;
    /** The plan, as parsed JSON (kept whole: the UI shows some of it). */
    public final Map<String, Object> plan;
    public final String server;
    public final List<String> notes;

    private Manifest(Fields f) {
        modelSha256 = f.str("model_sha256");
        modelName = f.str("model_name");
        device = f.str("device");
        inputs = Part.specs(f, "inputs");
        outputs = Part.specs(f, "outputs");
        List<Part> ps = new ArrayList<>();
        List<Object> raw = f.list("parts");
        for (int k = 0; k < raw.size(); k++) {
            ps.add(Part.parse(raw.get(k), "parts[" + k + "]", f.problems));
        }
        parts = Collections.unmodifiableList(ps);
        files = Collections.unmodifiableMap(f.stringMap("files"));
        Fields p = f.obj("plan", true);
        plan = p.map;
        server = f.optStr("server", null);
        notes = Collections.unmodifiableList(f.strings("notes", false));
    }

    /**
     * Parses and checks manifest text.
     *
     * @param source how messages name the manifest (its path or asset name)
     * @throws EdgesplitException (BUNDLE) listing every problem found
     */
    public static Manifest parse(String text, String source) throws EdgesplitException {
        Object doc;
        try {
            doc = Json.parse(text);
        } catch (Json.ParseException e) {
            throw new EdgesplitException(EdgesplitException.Kind.BUNDLE,
                    source + ": not a JSON manifest (" + e.getMessage() + ")", e);
        }
        List<String> problems = new ArrayList<>();
        Fields f = Fields.of(doc, "", problems);
        if (!problems.isEmpty()) {
            throw EdgesplitException.bundle(source + ": " + problems.get(0));
        }
        // Another version may mean anything; say so before reading any other field.
        Object version = f.map.get("format_version");
        if (!(version instanceof Long) || (Long) version != FORMAT_VERSION) {
            throw EdgesplitException.bundle(source + ": manifest format version "
                    + (version == null ? "missing" : Json.write(version)) + ", this app reads " + FORMAT_VERSION);
        }
        Manifest m = new Manifest(f);
        if (problems.isEmpty()) {
            m.checkConsistent(problems);
        }
        if (!problems.isEmpty()) {
            throw EdgesplitException.bundle(source + ": malformed manifest: " + String.join("; ", problems));
        }
        return m;
    }

    private void checkConsistent(List<String> problems) {
        for (Map.Entry<String, String> e : files.entrySet()) {
            String why = unsafePath(e.getKey());
            if (why != null) {
                problems.add("file path '" + e.getKey() + "' " + why);
            }
            if (!SHA256.matcher(e.getValue()).matches()) {
                problems.add("files['" + e.getKey() + "'] is not a lower-case hex sha256");
            }
        }
        Map<String, Part> byName = new LinkedHashMap<>();
        Map<String, String> producer = new HashMap<>();
        Set<String> modelInputs = new HashSet<>();
        for (TensorSpec t : inputs) {
            modelInputs.add(t.name);
        }
        for (Part p : parts) {
            if (byName.put(p.name, p) != null) {
                problems.add("two parts are named '" + p.name + "'");
            }
            for (TensorSpec t : p.outputs) {
                String other = producer.put(t.name, p.name);
                if (other != null) {
                    problems.add("tensor '" + t.name + "' is an output of both " + other + " and " + p.name);
                }
            }
            List<String> named = new ArrayList<>();
            named.add(p.file);
            named.add(p.onnxFile);
            if (p.fallback != null) {
                named.add(p.fallback.file);
            }
            for (String file : named) {
                if (!files.containsKey(file)) {
                    problems.add("part " + p.name + " names " + file + ", which the manifest has no checksum for");
                }
            }
        }
        if (parts.isEmpty()) {
            problems.add("the bundle has no parts");
        }
        for (Part p : parts) {
            for (String d : p.dependsOn) {
                if (!byName.containsKey(d)) {
                    problems.add("part " + p.name + " depends on unknown part '" + d + "'");
                }
            }
            for (TensorSpec t : p.inputs) {
                String from = producer.get(t.name);
                if (from == null && !modelInputs.contains(t.name)) {
                    problems.add("part " + p.name + " reads '" + t.name + "', which no part or model input provides");
                } else if (from != null && !p.dependsOn.contains(from)) {
                    problems.add("part " + p.name + " reads '" + t.name + "' from " + from
                            + " but does not depend on it");
                }
            }
        }
        for (TensorSpec t : outputs) {
            if (!producer.containsKey(t.name)) {
                problems.add("model output '" + t.name + "' is produced by no part");
            }
        }
        if (problems.isEmpty() && cycle() != null) {
            problems.add("the parts depend on each other in a cycle through " + cycle());
        }
    }

    /** A part on a dependency cycle, or null when the part graph is acyclic. */
    private String cycle() {
        Set<String> done = new HashSet<>();
        boolean progress = true;
        while (progress) {
            progress = false;
            for (Part p : parts) {
                if (!done.contains(p.name) && done.containsAll(p.dependsOn)) {
                    done.add(p.name);
                    progress = true;
                }
            }
        }
        for (Part p : parts) {
            if (!done.contains(p.name)) {
                return p.name;
            }
        }
        return null;
    }

    /** Why a relative path may not be used (absolute, or it climbs out), or null when it is fine. */
    static String unsafePath(String rel) {
        if (rel.isEmpty() || rel.startsWith("/") || rel.contains("\\") || rel.matches("^[A-Za-z]:.*")) {
            return "is not a relative path inside the bundle";
        }
        for (String seg : rel.split("/")) {
            if (seg.equals("..")) {
                return "leaves the bundle";
            }
        }
        return null;
    }

    public Part part(String name) {
        for (Part p : parts) {
            if (p.name.equals(name)) {
                return p;
            }
        }
        throw new IllegalArgumentException("no part '" + name + "' in the bundle");
    }

    /** The plan's predicted end-to-end latency in ms ({@code plan.predicted.latency_ms}), or null. */
    public Double predictedLatencyMs() {
        return predicted("latency_ms");
    }

    /** The plan's predicted device energy per inference in mJ ({@code plan.predicted.energy_mj}), or null. */
    public Double predictedEnergyMj() {
        return predicted("energy_mj");
    }

    private Double predicted(String key) {
        Object p = plan.get("predicted");
        if (p instanceof Map) {
            Object v = ((Map<?, ?>) p).get(key);
            if (v instanceof Number) {
                return ((Number) v).doubleValue();
            }
        }
        return null;
    }

    /** A one-line description of the plan: objective, solver, where the parts run. */
    public String planSummary() {
        StringBuilder b = new StringBuilder();
        Object objective = plan.get("objective");
        Object solver = plan.get("solver") instanceof Map ? ((Map<?, ?>) plan.get("solver")).get("name") : null;
        b.append(parts.size()).append(parts.size() == 1 ? " part" : " parts");
        if (objective != null) {
            b.append(", objective ").append(objective);
        }
        if (solver != null) {
            b.append(", solver ").append(solver);
        }
        if (server != null) {
            b.append(", server ").append(server);
        }
        return b.toString();
    }
}
