package dev.edgesplit.core;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The core on the command line: open a bundle (checking every checksum) and run its whole plan on
 * an {@code edgesplit serve --all-parts} server, every part over the Open Inference Protocol.
 * This is the JVM half of the cross-language test (tests/test_android_core.py).
 *
 * <pre>
 * java -cp CLASSES dev.edgesplit.core.RemoteRun --bundle DIR --url http://127.0.0.1:8000 \
 *      [--token T] --input NAME=FILE.npy ... --out DIR [--timeout-ms 30000]
 * java -cp CLASSES dev.edgesplit.core.RemoteRun --bundle DIR --check
 * </pre>
 *
 * Writes {@code OUT/<output>.npy} for every model output and {@code OUT/timings.json}. Exit codes
 * follow edgesplit's CLI: 0 success, 1 failure while running (the server), 2 bad input or usage
 * (a corrupt bundle, a wrong input). Errors are one line on stderr.
 */
public final class RemoteRun {
    private RemoteRun() {
    }

    public static void main(String[] args) {
        System.exit(run(args));
    }

    static int run(String[] args) {
        String bundle = null;
        String url = null;
        String token = System.getenv("EDGESPLIT_TOKEN");
        String out = null;
        int timeoutMs = 30_000;
        boolean check = false;
        Map<String, String> inputs = new LinkedHashMap<>();
        try {
            for (int k = 0; k < args.length; k++) {
                String a = args[k];
                if (a.equals("--check")) {
                    check = true;
                    continue;
                }
                if (k + 1 >= args.length) {
                    return usage(a + " needs a value");
                }
                String v = args[++k];
                switch (a) {
                    case "--bundle": bundle = v; break;
                    case "--url": url = v; break;
                    case "--token": token = v; break;
                    case "--out": out = v; break;
                    case "--timeout-ms": timeoutMs = Integer.parseInt(v); break;
                    case "--input":
                        int eq = v.indexOf('=');
                        if (eq <= 0) {
                            return usage("--input wants NAME=FILE.npy, not " + v);
                        }
                        inputs.put(v.substring(0, eq), v.substring(eq + 1));
                        break;
                    default:
                        return usage("unknown option " + a);
                }
            }
        } catch (NumberFormatException e) {
            return usage("--timeout-ms wants an integer");
        }
        if (bundle == null || !check && (url == null || out == null)) {
            return usage("--bundle is required, and --url and --out unless --check");
        }
        try {
            Bundle b = Bundle.open(BundleSource.directory(new File(bundle)));
            System.out.print(Report.header(b.manifest));
            if (check) {
                System.out.println("ok: manifest and " + b.files().size() + " file checksums verified");
                return 0;
            }
            Map<String, Tensor> feeds = new LinkedHashMap<>();
            for (Map.Entry<String, String> e : inputs.entrySet()) {
                feeds.put(e.getKey(), Npy.read(new File(e.getValue())));
            }
            OipClient client = new OipClient(url, token, Math.min(timeoutMs, 10_000), timeoutMs);
            PlanRunner.Options opts = new PlanRunner.Options();
            opts.runTimeoutMs = 2L * timeoutMs * b.manifest.parts.size();
            RunResult r;
            try (PlanRunner runner = new PlanRunner(b.manifest, RemoteExecutor.everyPart(client), opts)) {
                r = runner.run(feeds);
            }
            File dir = new File(out);
            if (!dir.isDirectory() && !dir.mkdirs()) {
                throw new IOException("cannot create " + dir);
            }
            for (Map.Entry<String, Tensor> e : r.outputs.entrySet()) {
                Npy.write(new File(dir, safeName(e.getKey()) + ".npy"), e.getValue());
            }
            writeText(new File(dir, "timings.json"), timingsJson(r));
            System.out.print(Report.run(b.manifest, r));
            return 0;
        } catch (EdgesplitException e) {
            System.err.println("error: " + e.userMessage());
            return e.kind() == EdgesplitException.Kind.BUNDLE || e.kind() == EdgesplitException.Kind.INPUT ? 2 : 1;
        } catch (IOException e) {
            System.err.println("error: " + e.getMessage());
            return 1;
        }
    }

    /** A file name for a tensor name: characters other than letters, digits, '.', '-', '_' become '_'. */
    public static String safeName(String tensor) {
        return tensor.replaceAll("[^A-Za-z0-9._-]", "_");
    }

    static String timingsJson(RunResult r) {
        List<Object> parts = new ArrayList<>();
        for (PartTiming t : r.parts) {
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("part", t.part);
            m.put("processor", t.processor);
            m.put("ran_on", t.ranOn);
            m.put("start_ms", t.startMs);
            m.put("latency_ms", t.latencyMs);
            m.put("predicted_ms", t.predictedMs);
            m.put("fell_back", t.fellBack);
            m.put("note", t.note);
            parts.add(m);
        }
        Map<String, Object> doc = new LinkedHashMap<>();
        doc.put("total_ms", r.totalMs);
        doc.put("parts", parts);
        return Json.write(doc) + "\n";
    }

    private static void writeText(File f, String text) throws IOException {
        File tmp = new File(f.getPath() + ".tmp");
        try (OutputStream o = new FileOutputStream(tmp)) {
            o.write(text.getBytes(StandardCharsets.UTF_8));
        }
        if (!tmp.renameTo(f)) {
            throw new IOException("cannot write " + f);
        }
    }

    private static int usage(String why) {
        System.err.println("error: " + why);
        System.err.println("usage: RemoteRun --bundle DIR (--check | --url URL --out DIR [--token T]"
                + " [--input NAME=FILE.npy]... [--timeout-ms N])");
        return 2;
    }
}
