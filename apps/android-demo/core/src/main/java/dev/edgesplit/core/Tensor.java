package dev.edgesplit.core;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;

/**
 * An immutable dense tensor: element type, shape and its row-major little-endian bytes, the layout
 * of the Open Inference Protocol's binary extension, of {@code .npy} files and of ONNX Runtime on
 * every Android ABI. Booleans are one byte, 0 or 1.
 */
public final class Tensor {
    public final DType dtype;
    private final long[] shape;
    private final byte[] data;

    private Tensor(DType dtype, long[] shape, byte[] data) {
        this.dtype = dtype;
        this.shape = shape;
        this.data = data;
    }

    /**
     * A tensor over raw little-endian bytes (copied).
     *
     * @throws EdgesplitException (INPUT) when the byte count does not match the shape.
     */
    public static Tensor ofBytes(DType dtype, long[] shape, byte[] data) throws EdgesplitException {
        long n = count(shape);
        if (n * dtype.itemBytes != data.length) {
            throw EdgesplitException.input(dtype.numpy + Arrays.toString(shape) + " needs "
                    + n * dtype.itemBytes + " bytes, got " + data.length);
        }
        if (dtype == DType.BOOL) {
            for (int k = 0; k < data.length; k++) {
                if (data[k] != 0 && data[k] != 1) {
                    throw EdgesplitException.input("bool tensor holds byte " + (data[k] & 0xff) + " at " + k);
                }
            }
        }
        return new Tensor(dtype, shape.clone(), data.clone());
    }

    public static Tensor ofFloats(long[] shape, float... values) throws EdgesplitException {
        checkCount(shape, values.length);
        ByteBuffer b = le(values.length * 4);
        for (float v : values) {
            b.putFloat(v);
        }
        return new Tensor(DType.FP32, shape.clone(), b.array());
    }

    /** An FP16 tensor from floats, each rounded to the nearest half. */
    public static Tensor ofHalfs(long[] shape, float... values) throws EdgesplitException {
        checkCount(shape, values.length);
        ByteBuffer b = le(values.length * 2);
        for (float v : values) {
            b.putShort(Half.fromFloat(v));
        }
        return new Tensor(DType.FP16, shape.clone(), b.array());
    }

    public static Tensor ofDoubles(long[] shape, double... values) throws EdgesplitException {
        checkCount(shape, values.length);
        ByteBuffer b = le(values.length * 8);
        for (double v : values) {
            b.putDouble(v);
        }
        return new Tensor(DType.FP64, shape.clone(), b.array());
    }

    public static Tensor ofInts(long[] shape, int... values) throws EdgesplitException {
        checkCount(shape, values.length);
        ByteBuffer b = le(values.length * 4);
        for (int v : values) {
            b.putInt(v);
        }
        return new Tensor(DType.INT32, shape.clone(), b.array());
    }

    public static Tensor ofLongs(long[] shape, long... values) throws EdgesplitException {
        checkCount(shape, values.length);
        ByteBuffer b = le(values.length * 8);
        for (long v : values) {
            b.putLong(v);
        }
        return new Tensor(DType.INT64, shape.clone(), b.array());
    }

    public static Tensor ofBools(long[] shape, boolean... values) throws EdgesplitException {
        checkCount(shape, values.length);
        byte[] d = new byte[values.length];
        for (int k = 0; k < values.length; k++) {
            d[k] = (byte) (values[k] ? 1 : 0);
        }
        return new Tensor(DType.BOOL, shape.clone(), d);
    }

    /**
     * A tensor of {@code dtype} from numbers (JSON {@code data} of an OIP tensor, flattened).
     *
     * @throws EdgesplitException (INPUT) when a value does not fit the type or the count is wrong.
     */
    public static Tensor ofNumbers(DType dtype, long[] shape, Iterable<?> values) throws EdgesplitException {
        long n = count(shape);
        ByteBuffer b = le(Math.toIntExact(n * dtype.itemBytes));
        long k = 0;
        for (Object v : values) {
            if (k++ >= n) {
                break;
            }
            put(b, dtype, v);
        }
        if (k != n) {
            throw EdgesplitException.input("holds " + k + " values, shape " + Arrays.toString(shape) + " needs " + n);
        }
        return new Tensor(dtype, shape.clone(), b.array());
    }

    private static void put(ByteBuffer b, DType t, Object v) throws EdgesplitException {
        if (t == DType.BOOL) {
            if (!(v instanceof Boolean)) {
                throw EdgesplitException.input("value " + v + " is not a bool");
            }
            b.put((byte) ((Boolean) v ? 1 : 0));
            return;
        }
        if (!(v instanceof Number)) {
            throw EdgesplitException.input("value " + v + " is not a number");
        }
        Number x = (Number) v;
        switch (t) {
            case FP32: b.putFloat(x.floatValue()); return;
            case FP16: b.putShort(Half.fromFloat(x.floatValue())); return;
            case FP64: b.putDouble(x.doubleValue()); return;
            default:
        }
        if (!(x instanceof Long || x instanceof Integer)) {
            throw EdgesplitException.input("value " + v + " is not an integer");
        }
        long l = x.longValue();
        long lo;
        long hi;
        switch (t) {
            case INT8: lo = Byte.MIN_VALUE; hi = Byte.MAX_VALUE; break;
            case UINT8: lo = 0; hi = 255; break;
            case INT16: lo = Short.MIN_VALUE; hi = Short.MAX_VALUE; break;
            case INT32: lo = Integer.MIN_VALUE; hi = Integer.MAX_VALUE; break;
            default: lo = Long.MIN_VALUE; hi = Long.MAX_VALUE;
        }
        if (l < lo || l > hi) {
            throw EdgesplitException.input("value " + l + " is out of range for " + t.numpy);
        }
        switch (t) {
            case INT8: case UINT8: b.put((byte) l); break;
            case INT16: b.putShort((short) l); break;
            case INT32: b.putInt((int) l); break;
            default: b.putLong(l);
        }
    }

    // ---- reading

    public long[] shape() {
        return shape.clone();
    }

    public long count() {
        return count(shape);
    }

    /** Size of the raw data in bytes. */
    public int nbytes() {
        return data.length;
    }

    /** A copy of the raw little-endian bytes. */
    public byte[] bytes() {
        return data.clone();
    }

    /** A read-only little-endian view of the raw bytes (no copy). */
    public ByteBuffer buffer() {
        return ByteBuffer.wrap(data).asReadOnlyBuffer().order(ByteOrder.LITTLE_ENDIAN);
    }

    /** The values as floats: FP32 as is, FP16 widened, FP64 narrowed; other types are refused. */
    public float[] toFloats() {
        int n = (int) count();
        float[] out = new float[n];
        ByteBuffer b = buffer();
        for (int k = 0; k < n; k++) {
            switch (dtype) {
                case FP32: out[k] = b.getFloat(); break;
                case FP16: out[k] = Half.toFloat(b.getShort()); break;
                case FP64: out[k] = (float) b.getDouble(); break;
                default: throw new IllegalStateException("toFloats() on a " + dtype.numpy + " tensor");
            }
        }
        return out;
    }

    /** The values as longs, for every integer type and bool. */
    public long[] toLongs() {
        int n = (int) count();
        long[] out = new long[n];
        ByteBuffer b = buffer();
        for (int k = 0; k < n; k++) {
            switch (dtype) {
                case INT8: case BOOL: out[k] = b.get(); break;
                case UINT8: out[k] = b.get() & 0xff; break;
                case INT16: out[k] = b.getShort(); break;
                case INT32: out[k] = b.getInt(); break;
                case INT64: out[k] = b.getLong(); break;
                default: throw new IllegalStateException("toLongs() on a " + dtype.numpy + " tensor");
            }
        }
        return out;
    }

    /**
     * Checks the tensor against a spec.
     *
     * @param what how messages name the tensor, e.g. {@code "part p1 input 'x'"}
     * @throws EdgesplitException (INPUT) naming the tensor, the expected and the actual type or shape
     */
    public void check(TensorSpec spec, String what) throws EdgesplitException {
        if (dtype != spec.dtype) {
            throw EdgesplitException.input(what + ": " + dtype.numpy + ", expected " + spec.dtype.numpy);
        }
        if (!Arrays.equals(shape, spec.shape())) {
            throw EdgesplitException.input(what + ": shape " + Arrays.toString(shape) + ", expected "
                    + Arrays.toString(spec.shape()));
        }
    }

    // ---- helpers

    /** Elements in a shape; every dimension must be static and non-negative, the total below 2^31. */
    public static long count(long[] shape) {
        long n = 1;
        for (long d : shape) {
            if (d < 0) {
                throw new IllegalArgumentException("negative dimension in " + Arrays.toString(shape));
            }
            n = Math.multiplyExact(n, d);
        }
        if (n > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("tensor of " + n + " elements is too large");
        }
        return n;
    }

    private static void checkCount(long[] shape, int n) throws EdgesplitException {
        if (count(shape) != n) {
            throw EdgesplitException.input(n + " values do not fill shape " + Arrays.toString(shape));
        }
    }

    private static ByteBuffer le(int n) {
        return ByteBuffer.allocate(n).order(ByteOrder.LITTLE_ENDIAN);
    }

    @Override
    public String toString() {
        return "Tensor(" + dtype.numpy + Arrays.toString(shape) + ")";
    }

    @Override
    public boolean equals(Object o) {
        if (!(o instanceof Tensor)) {
            return false;
        }
        Tensor t = (Tensor) o;
        return dtype == t.dtype && Arrays.equals(shape, t.shape) && Arrays.equals(data, t.data);
    }

    @Override
    public int hashCode() {
        return 31 * Arrays.hashCode(shape) + Arrays.hashCode(data);
    }
}
