package dev.edgesplit.core;

import java.util.Map;

/**
 * Runs one part. Contract: {@link #run} takes exactly the part's inputs (checked against its specs
 * by the caller) and returns at least its outputs; the scheduler checks each output's type and
 * shape. Implementations may be called from several threads, never concurrently for one part
 * within one run. Failures are {@link EdgesplitException}s: kind REMOTE for the server (the
 * scheduler may then use the part's local fallback), LOCAL for this device.
 */
public interface PartExecutor extends AutoCloseable {
    Map<String, Tensor> run(Map<String, Tensor> inputs) throws EdgesplitException;

    /** Where the part runs, for the screen: {@code "ORT XNNPACK"}, {@code "server http://..."}. */
    String describe();

    /** Whether failures here are the network's: true for a server. */
    default boolean isRemote() {
        return false;
    }

    @Override
    default void close() {
    }
}
