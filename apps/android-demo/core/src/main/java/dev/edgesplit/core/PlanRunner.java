package dev.edgesplit.core;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Runs a bundle's plan: each part starts as soon as the parts it depends on have finished, on a
 * thread pool, so independent parts run at the same time (on their own processors, or one on the
 * server while another runs here).
 *
 * <p>When a server part fails with a REMOTE error (unreachable, too slow, an HTTP error) and the
 * provider has a local fallback for it, the fallback runs the part and the timing says why. After
 * such a failure the server is skipped for {@link Options#serverRetryMs}, so a phone off the
 * network does not wait for a timeout on every request. A run never hangs: it fails after
 * {@link Options#runTimeoutMs}.
 */
public final class PlanRunner implements AutoCloseable {
    /** Knobs of the scheduler. */
    public static final class Options {
        /** Worker threads; 0 means one per part. */
        public int threads = 0;
        /** Longest a run may take before it fails. */
        public long runTimeoutMs = 60_000;
        /** How long the server is skipped after it failed (when a fallback exists). */
        public long serverRetryMs = 5_000;
    }

    private final Manifest manifest;
    private final ExecutorProvider provider;
    private final Options options;
    private final Map<String, PartExecutor> primary = new HashMap<>();
    private final Map<String, PartExecutor> fallbacks = new ConcurrentHashMap<>();
    private final ExecutorService pool;
    private final AtomicLong serverDownUntilNs = new AtomicLong(Long.MIN_VALUE);
    private volatile String serverDownWhy = "";

    /** Builds every part's executor now, so a part that cannot load fails here, not mid-run. */
    public PlanRunner(Manifest manifest, ExecutorProvider provider, Options options) throws EdgesplitException {
        this.manifest = manifest;
        this.provider = provider;
        this.options = options;
        try {
            for (Part p : manifest.parts) {
                primary.put(p.name, provider.primary(p));
            }
        } catch (EdgesplitException | RuntimeException e) {
            close();
            throw e;
        }
        final AtomicInteger n = new AtomicInteger();
        ThreadFactory named = r -> {
            Thread t = new Thread(r, "edgesplit-part-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        };
        int threads = options.threads > 0 ? options.threads : Math.max(1, manifest.parts.size());
        pool = Executors.newFixedThreadPool(threads, named);
    }

    public PlanRunner(Manifest manifest, ExecutorProvider provider) throws EdgesplitException {
        this(manifest, provider, new Options());
    }

    /**
     * Runs the model once.
     *
     * @param inputs exactly the model's inputs, by name
     * @throws EdgesplitException INPUT for wrong inputs; the failing part's error (prefixed with the
     *     part and its processor) otherwise; LOCAL when the run does not finish in time
     */
    public RunResult run(Map<String, Tensor> inputs) throws EdgesplitException {
        final long t0 = System.nanoTime();
        final Map<String, Tensor> store = new ConcurrentHashMap<>(checkInputs(inputs));
        final Map<String, CompletableFuture<PartTiming>> futures = new LinkedHashMap<>();
        for (final Part p : manifest.parts) { // a topological order: dependencies come first
            List<CompletableFuture<PartTiming>> deps = new ArrayList<>();
            for (String d : p.dependsOn) {
                deps.add(futures.get(d));
            }
            CompletableFuture<PartTiming> f = CompletableFuture
                    .allOf(deps.toArray(new CompletableFuture<?>[0]))
                    .thenApplyAsync(ignored -> {
                        try {
                            return runPart(p, store, t0);
                        } catch (EdgesplitException e) {
                            throw new CompletionException(e);
                        }
                    }, pool);
            futures.put(p.name, f);
        }
        CompletableFuture<Void> all = CompletableFuture.allOf(futures.values().toArray(new CompletableFuture<?>[0]));
        try {
            all.get(options.runTimeoutMs, TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new EdgesplitException(EdgesplitException.Kind.LOCAL, "the run was interrupted", e);
        } catch (TimeoutException e) {
            List<String> running = new ArrayList<>();
            for (Map.Entry<String, CompletableFuture<PartTiming>> f : futures.entrySet()) {
                if (!f.getValue().isDone()) {
                    running.add(f.getKey());
                }
            }
            throw new EdgesplitException(EdgesplitException.Kind.LOCAL, "the run did not finish within "
                    + options.runTimeoutMs + " ms (unfinished parts: " + String.join(", ", running) + ")", e);
        } catch (ExecutionException e) {
            throw unwrap(e.getCause());
        }
        List<PartTiming> timings = new ArrayList<>();
        for (CompletableFuture<PartTiming> f : futures.values()) {
            timings.add(f.join());
        }
        Map<String, Tensor> outputs = new LinkedHashMap<>();
        for (TensorSpec t : manifest.outputs) {
            outputs.put(t.name, store.get(t.name));
        }
        return new RunResult(outputs, timings, (System.nanoTime() - t0) / 1e6);
    }

    private Map<String, Tensor> checkInputs(Map<String, Tensor> inputs) throws EdgesplitException {
        List<String> expected = new ArrayList<>();
        for (TensorSpec t : manifest.inputs) {
            expected.add(t.name);
        }
        for (String name : inputs.keySet()) {
            if (!expected.contains(name)) {
                throw EdgesplitException.input("unknown input '" + name + "'; the model takes " + String.join(", ", expected));
            }
        }
        for (TensorSpec t : manifest.inputs) {
            Tensor x = inputs.get(t.name);
            if (x == null) {
                throw EdgesplitException.input("missing input '" + t.name + "'; the model takes " + String.join(", ", expected));
            }
            x.check(t, "model input '" + t.name + "'");
        }
        return inputs;
    }

    private PartTiming runPart(Part p, Map<String, Tensor> store, long t0) throws EdgesplitException {
        Map<String, Tensor> feeds = new LinkedHashMap<>();
        for (TensorSpec t : p.inputs) {
            Tensor x = store.get(t.name);
            x.check(t, "part " + p.name + " input '" + t.name + "'");
            feeds.put(t.name, x);
        }
        PartExecutor exec = primary.get(p.name);
        long start = System.nanoTime();
        Map<String, Tensor> out;
        String processor = p.processor;
        boolean fellBack = false;
        String note = "";
        if (exec.isRemote() && System.nanoTime() < serverDownUntilNs.get() && fallback(p) != null) {
            note = "server skipped (it failed " + ms(System.nanoTime() - serverDownSinceNs()) + " ago: "
                    + serverDownWhy + ")";
            exec = fallback(p);
            fellBack = true;
            start = System.nanoTime();
            out = call(p, exec, feeds);
        } else {
            try {
                out = call(p, exec, feeds);
            } catch (EdgesplitException e) {
                PartExecutor fb = e.kind() == EdgesplitException.Kind.REMOTE ? fallback(p) : null;
                if (fb == null) {
                    throw e;
                }
                String why = e.getCause() instanceof EdgesplitException ? e.getCause().getMessage() : e.getMessage();
                serverDownWhy = why;
                serverDownUntilNs.set(System.nanoTime() + options.serverRetryMs * 1_000_000L);
                note = "server failed (" + why + ")";
                exec = fb;
                fellBack = true;
                start = System.nanoTime();
                try {
                    out = call(p, exec, feeds);
                } catch (EdgesplitException local) {
                    throw new EdgesplitException(local.kind(), local.getMessage() + " (after the server failed: "
                            + why + ")", local);
                }
            }
        }
        if (fellBack) {
            processor = p.fallback != null ? p.fallback.processor : processor;
            note += "; ran the local fallback on " + processor;
        }
        long end = System.nanoTime();
        for (TensorSpec t : p.outputs) {
            Tensor y = out.get(t.name);
            String what = where(p, exec) + " output '" + t.name + "'";
            EdgesplitException.Kind kind = exec.isRemote() ? EdgesplitException.Kind.REMOTE : EdgesplitException.Kind.LOCAL;
            if (y == null) {
                throw new EdgesplitException(kind, what + " is missing from its result");
            }
            try {
                y.check(t, what);
            } catch (EdgesplitException e) {
                throw new EdgesplitException(kind, e.getMessage());
            }
            store.put(t.name, y);
        }
        return new PartTiming(p.name, processor, exec.describe(), (start - t0) / 1e6, (end - start) / 1e6,
                p.predictedMs, fellBack, note);
    }

    private long serverDownSinceNs() {
        return serverDownUntilNs.get() - options.serverRetryMs * 1_000_000L;
    }

    private static String ms(long ns) {
        return String.format("%.1f s", ns / 1e9);
    }

    /** Runs one executor; its errors are prefixed with the part and where it ran. */
    private static Map<String, Tensor> call(Part p, PartExecutor exec, Map<String, Tensor> feeds)
            throws EdgesplitException {
        try {
            Map<String, Tensor> out = exec.run(feeds);
            if (out == null) {
                throw new EdgesplitException(EdgesplitException.Kind.LOCAL, "part " + p.name + ": no result");
            }
            return out;
        } catch (EdgesplitException e) {
            throw new EdgesplitException(e.kind(), where(p, exec) + ": " + e.getMessage(), e.httpStatus(), e);
        } catch (RuntimeException e) {
            throw new EdgesplitException(exec.isRemote() ? EdgesplitException.Kind.REMOTE : EdgesplitException.Kind.LOCAL,
                    where(p, exec) + " failed: " + e, e);
        }
    }

    private static String where(Part p, PartExecutor exec) {
        return "part " + p.name + " (" + (exec.isRemote() ? p.processor : exec.describe()) + ")";
    }

    /** The part's fallback executor, made on first use; null when it has none. */
    private PartExecutor fallback(Part p) throws EdgesplitException {
        PartExecutor fb = fallbacks.get(p.name);
        if (fb != null) {
            return fb;
        }
        synchronized (fallbacks) {
            fb = fallbacks.get(p.name);
            if (fb == null) {
                fb = provider.fallback(p);
                if (fb != null) {
                    fallbacks.put(p.name, fb);
                }
            }
        }
        return fb;
    }

    private static EdgesplitException unwrap(Throwable t) {
        while ((t instanceof CompletionException || t instanceof ExecutionException) && t.getCause() != null) {
            t = t.getCause();
        }
        if (t instanceof EdgesplitException) {
            return (EdgesplitException) t;
        }
        return new EdgesplitException(EdgesplitException.Kind.LOCAL, "unexpected failure: " + t, t);
    }

    /** Stops the worker threads and closes every executor. */
    @Override
    public void close() {
        if (pool != null) {
            pool.shutdownNow();
        }
        for (PartExecutor e : primary.values()) {
            e.close();
        }
        for (PartExecutor e : fallbacks.values()) {
            e.close();
        }
    }
}
