package dev.edgesplit.core;

import java.util.Arrays;

/** Name, static shape and element type of a tensor that crosses a part boundary. */
public final class TensorSpec {
    public final String name;
    private final long[] shape;
    public final DType dtype;

    public TensorSpec(String name, long[] shape, DType dtype) {
        this.name = name;
        this.shape = shape.clone();
        this.dtype = dtype;
    }

    public long[] shape() {
        return shape.clone();
    }

    /** Elements in the tensor. */
    public long count() {
        return Tensor.count(shape);
    }

    /** The same checks as {@link Tensor#check(TensorSpec, String)}, from here. */
    public void check(Tensor t, String what) throws EdgesplitException {
        t.check(this, what);
    }

    @Override
    public String toString() {
        return name + " " + dtype.numpy + Arrays.toString(shape);
    }
}
