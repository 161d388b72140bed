package dev.edgesplit.core;

/**
 * Element types the core moves: the numpy name the manifest uses, the Open Inference Protocol
 * datatype, the {@code .npy} descriptor and the size of one element in bytes.
 */
public enum DType {
    FP32("float32", "FP32", "<f4", 4),
    FP16("float16", "FP16", "<f2", 2),
    FP64("float64", "FP64", "<f8", 8),
    INT8("int8", "INT8", "|i1", 1),
    UINT8("uint8", "UINT8", "|u1", 1),
    INT16("int16", "INT16", "<i2", 2),
    INT32("int32", "INT32", "<i4", 4),
    INT64("int64", "INT64", "<i8", 8),
    BOOL("bool", "BOOL", "|b1", 1);

    public final String numpy;
    public final String oip;
    public final String npyDescr;
    public final int itemBytes;

    DType(String numpy, String oip, String npyDescr, int itemBytes) {
        this.numpy = numpy;
        this.oip = oip;
        this.npyDescr = npyDescr;
        this.itemBytes = itemBytes;
    }

    /** The type of a numpy dtype name ({@code float32}); null when the core does not handle it. */
    public static DType fromNumpy(String name) {
        for (DType t : values()) {
            if (t.numpy.equals(name)) {
                return t;
            }
        }
        return null;
    }

    /** The type of an OIP datatype ({@code FP32}); null when the core does not handle it. */
    public static DType fromOip(String name) {
        for (DType t : values()) {
            if (t.oip.equals(name)) {
                return t;
            }
        }
        return null;
    }

    /**
     * The type of a {@code .npy} descriptor ({@code <f4}, {@code |u1}); null when not handled.
     * Big-endian data ({@code >f4}) is refused; {@code =} (native) is read as little-endian, the
     * order of every platform the core targets.
     */
    public static DType fromNpy(String descr) {
        if (descr.length() < 2) {
            return null;
        }
        char order = descr.charAt(0);
        for (DType t : values()) {
            if (t.npyDescr.substring(1).equals(descr.substring(1))) {
                return order == '>' && t.itemBytes > 1 ? null : t;
            }
        }
        return null;
    }

    /** All names, for messages: {@code float32, float16, ...}. */
    public static String supportedNumpy() {
        StringBuilder b = new StringBuilder();
        for (DType t : values()) {
            b.append(b.length() == 0 ? "" : ", ").append(t.numpy);
        }
        return b.toString();
    }
}
