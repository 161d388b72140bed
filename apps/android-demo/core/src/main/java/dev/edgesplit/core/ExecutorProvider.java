package dev.edgesplit.core;

/**
 * Makes the executors of a bundle's parts: ONNX Runtime sessions on Android, the OIP client for
 * server parts. The scheduler calls {@link #primary} for every part when it is built, and
 * {@link #fallback} only when a part's server fails, once.
 */
public interface ExecutorProvider {
    /** The executor that runs {@code part} as planned. */
    PartExecutor primary(Part part) throws EdgesplitException;

    /** What runs {@code part} on this device when its server fails; null when nothing can. */
    PartExecutor fallback(Part part) throws EdgesplitException;
}
