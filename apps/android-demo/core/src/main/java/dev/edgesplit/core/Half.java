package dev.edgesplit.core;

/** IEEE 754 half precision (FP16) from and to float: round to nearest even, as numpy does. */
public final class Half {
    private Half() {
    }

    /** The half nearest to {@code f} (ties to even); overflow gives infinity, NaN stays NaN. */
    public static short fromFloat(float f) {
        int bits = Float.floatToRawIntBits(f);
        int sign = (bits >>> 16) & 0x8000;
        int exp = (bits >>> 23) & 0xff;
        int mant = bits & 0x7fffff;
        if (exp == 0xff) {
            return (short) (sign | 0x7c00 | (mant != 0 ? 0x200 | (mant >>> 13) : 0));
        }
        int e = exp - 127 + 15;
        if (e >= 31) {
            return (short) (sign | 0x7c00);
        }
        if (e <= 0) { // a half subnormal, or zero
            if (e < -10) {
                return (short) sign;
            }
            mant |= 0x800000;
            int shift = 14 - e;
            int h = mant >>> shift;
            int rem = mant & ((1 << shift) - 1);
            int mid = 1 << (shift - 1);
            if (rem > mid || rem == mid && (h & 1) != 0) {
                h++;
            }
            return (short) (sign | h);
        }
        int h = (e << 10) | (mant >>> 13);
        int rem = mant & 0x1fff;
        if (rem > 0x1000 || rem == 0x1000 && (h & 1) != 0) {
            h++; // a carry into the exponent is right, up to infinity
        }
        return (short) (sign | h);
    }

    /** The float value of a half (exact). */
    public static float toFloat(short half) {
        int bits = half & 0xffff;
        int sign = (bits & 0x8000) << 16;
        int exp = (bits >>> 10) & 0x1f;
        int mant = bits & 0x3ff;
        if (exp == 0) {
            float v = mant * 0x1p-24f;
            return sign != 0 ? -v : v;
        }
        if (exp == 31) {
            return Float.intBitsToFloat(sign | 0x7f800000 | (mant << 13));
        }
        return Float.intBitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
    }
}
