package dev.edgesplit.core;

/**
 * The one error type the core raises. Its message is one line, fit to show a user as is: it names
 * the file, part, tensor or server at fault. {@link #kind()} says which layer failed, so a UI can
 * title it and the scheduler can decide whether a local fallback may help.
 */
public class EdgesplitException extends Exception {
    private static final long serialVersionUID = 1L;

    /** Which layer failed. */
    public enum Kind {
        /** The bundle: its manifest is malformed, a file is missing or its checksum differs. */
        BUNDLE("Bundle problem"),
        /** The inputs given to a run, or tensors that do not match their specs. */
        INPUT("Input problem"),
        /** The offload server: unreachable, too slow, or it answered with an error. */
        REMOTE("Server problem"),
        /** A part that runs on this device failed (ONNX Runtime, an execution provider). */
        LOCAL("On-device problem");

        public final String title;

        Kind(String title) {
            this.title = title;
        }
    }

    private final Kind kind;
    private final int httpStatus;

    public EdgesplitException(Kind kind, String message) {
        this(kind, message, 0, null);
    }

    public EdgesplitException(Kind kind, String message, Throwable cause) {
        this(kind, message, 0, cause);
    }

    public EdgesplitException(Kind kind, String message, int httpStatus, Throwable cause) {
        super(message, cause);
        this.kind = kind;
        this.httpStatus = httpStatus;
    }

    public Kind kind() {
        return kind;
    }

    /** The HTTP status the server answered with, or 0 when there was no answer (or no server). */
    public int httpStatus() {
        return httpStatus;
    }

    /** The message for a person: {@code "Server problem: http://...: HTTP 503: overloaded"}. */
    public String userMessage() {
        return kind.title + ": " + getMessage();
    }

    static EdgesplitException bundle(String message) {
        return new EdgesplitException(Kind.BUNDLE, message);
    }

    static EdgesplitException input(String message) {
        return new EdgesplitException(Kind.INPUT, message);
    }
}
