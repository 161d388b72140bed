package dev.edgesplit.core;

/**
 * Pixels to a model input: ARGB pixels (as Android's {@code Bitmap.getPixels} gives them) resized
 * to the input's height and width (bilinear), scaled to [0, 1], normalised per channel, laid out
 * NCHW (or NHWC when the last dimension is 3) as float32.
 */
public final class ImageTensors {
    /** ImageNet's per-channel mean and standard deviation (RGB), the usual classifier preprocessing. */
    public static final float[] IMAGENET_MEAN = {0.485f, 0.456f, 0.406f};
    public static final float[] IMAGENET_STD = {0.229f, 0.224f, 0.225f};

    private ImageTensors() {
    }

    /**
     * @param argb {@code width * height} pixels, row by row
     * @throws EdgesplitException (INPUT) when {@code spec} is not a float32 image of 3 channels, batch 1
     */
    public static Tensor fromArgb(int[] argb, int width, int height, TensorSpec spec, float[] mean, float[] std)
            throws EdgesplitException {
        long[] s = spec.shape();
        boolean nchw = s.length == 4 && s[0] == 1 && s[1] == 3;
        boolean nhwc = s.length == 4 && s[0] == 1 && s[3] == 3 && !nchw;
        if (spec.dtype != DType.FP32 || !nchw && !nhwc) {
            throw EdgesplitException.input("input '" + spec.name + "' is " + spec
                    + "; the picture needs a float32 [1, 3, H, W] or [1, H, W, 3] input");
        }
        if (argb.length != width * height || width <= 0 || height <= 0) {
            throw EdgesplitException.input("picture of " + width + "x" + height + " with " + argb.length + " pixels");
        }
        int h = (int) (nchw ? s[2] : s[1]);
        int w = (int) (nchw ? s[3] : s[2]);
        float[] out = new float[3 * h * w];
        for (int y = 0; y < h; y++) {
            float sy = Math.max(0f, (y + 0.5f) * height / h - 0.5f);
            int y0 = Math.min((int) sy, height - 1);
            int y1 = Math.min(y0 + 1, height - 1);
            float fy = sy - y0;
            for (int x = 0; x < w; x++) {
                float sx = Math.max(0f, (x + 0.5f) * width / w - 0.5f);
                int x0 = Math.min((int) sx, width - 1);
                int x1 = Math.min(x0 + 1, width - 1);
                float fx = sx - x0;
                for (int c = 0; c < 3; c++) {
                    int shift = 16 - 8 * c; // R, G, B
                    float top = chan(argb[y0 * width + x0], shift) * (1 - fx) + chan(argb[y0 * width + x1], shift) * fx;
                    float bot = chan(argb[y1 * width + x0], shift) * (1 - fx) + chan(argb[y1 * width + x1], shift) * fx;
                    float v = ((top * (1 - fy) + bot * fy) / 255f - mean[c]) / std[c];
                    out[nchw ? (c * h + y) * w + x : (y * w + x) * 3 + c] = v;
                }
            }
        }
        return Tensor.ofFloats(s, out);
    }

    private static float chan(int argb, int shift) {
        return (argb >> shift) & 0xff;
    }
}
