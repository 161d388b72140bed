package dev.edgesplit.core;

import static dev.edgesplit.core.Fixtures.shape;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import org.junit.Test;

public class TensorTest {
    @Test
    public void bytesAreLittleEndianRowMajor() throws Exception {
        assertArrayEquals(new byte[] {0, 0, (byte) 0x80, 0x3f, 0, 0, 0, (byte) 0xc0},
                Tensor.ofFloats(shape(2), 1f, -2f).bytes());
        assertArrayEquals(new byte[] {1, 0, 0, 0, (byte) 0xff, (byte) 0xff, (byte) 0xff, (byte) 0xff},
                Tensor.ofInts(shape(2), 1, -1).bytes());
        assertArrayEquals(new byte[] {2, 1, 0, 0, 0, 0, 0, 0}, Tensor.ofLongs(shape(1, 1), 0x102L).bytes());
        assertArrayEquals(new byte[] {0, 0x3c}, Tensor.ofHalfs(shape(1), 1f).bytes());
        assertArrayEquals(new byte[] {1, 0, 1}, Tensor.ofBools(shape(3), true, false, true).bytes());
    }

    @Test
    public void roundTripsEveryType() throws Exception {
        assertArrayEquals(new float[] {1.5f, -0f, 3e-7f}, Tensor.ofFloats(shape(3), 1.5f, -0f, 3e-7f).toFloats(), 0f);
        assertArrayEquals(new long[] {Long.MIN_VALUE, 7}, Tensor.ofLongs(shape(2), Long.MIN_VALUE, 7).toLongs());
        assertArrayEquals(new long[] {1, 0}, Tensor.ofBools(shape(2), true, false).toLongs());
        assertArrayEquals(new float[] {0.5f, 0.25f}, Tensor.ofDoubles(shape(2), 0.5, 0.25).toFloats(), 0f);
        Tensor u8 = Tensor.ofBytes(DType.UINT8, shape(2, 1), new byte[] {(byte) 255, 3});
        assertArrayEquals(new long[] {255, 3}, u8.toLongs());
        Tensor i8 = Tensor.ofBytes(DType.INT8, shape(1), new byte[] {(byte) 255});
        assertArrayEquals(new long[] {-1}, i8.toLongs());
        Tensor i16 = Tensor.ofBytes(DType.INT16, shape(1), new byte[] {(byte) 0xfe, (byte) 0xff});
        assertArrayEquals(new long[] {-2}, i16.toLongs());
    }

    @Test
    public void shapeAndSizeAreChecked() throws Exception {
        EdgesplitException e = assertThrows(EdgesplitException.class, () -> Tensor.ofFloats(shape(2, 2), 1f, 2f, 3f));
        assertEquals(EdgesplitException.Kind.INPUT, e.kind());
        e = assertThrows(EdgesplitException.class, () -> Tensor.ofBytes(DType.INT64, shape(2), new byte[15]));
        assertTrue(e.getMessage(), e.getMessage().contains("needs 16 bytes, got 15"));
        assertThrows(EdgesplitException.class, () -> Tensor.ofBytes(DType.BOOL, shape(1), new byte[] {2}));
        assertThrows(IllegalArgumentException.class, () -> Tensor.ofFloats(shape(-1)));
        assertThrows(IllegalArgumentException.class, () -> Tensor.count(shape(1 << 20, 1 << 20)));
        assertEquals(0, Tensor.ofFloats(shape(0, 3)).nbytes());
        assertEquals(1, Tensor.ofFloats(shape(), 2f).count());
    }

    @Test
    public void checkNamesTheTensorAndBothShapes() throws Exception {
        TensorSpec spec = new TensorSpec("x", shape(1, 3), DType.FP32);
        Tensor t = Tensor.ofFloats(shape(3, 1), 1, 2, 3);
        EdgesplitException e = assertThrows(EdgesplitException.class, () -> t.check(spec, "input 'x'"));
        assertEquals("input 'x': shape [3, 1], expected [1, 3]", e.getMessage());
        e = assertThrows(EdgesplitException.class, () -> Tensor.ofInts(shape(1, 3), 1, 2, 3).check(spec, "input 'x'"));
        assertEquals("input 'x': int32, expected float32", e.getMessage());
        Tensor.ofFloats(shape(1, 3), 1, 2, 3).check(spec, "ok");
    }

    @Test
    public void numbersFromJsonData() throws Exception {
        Tensor t = Tensor.ofNumbers(DType.INT32, shape(2), Arrays.asList(1L, -7L));
        assertArrayEquals(new long[] {1, -7}, t.toLongs());
        assertArrayEquals(new float[] {0.5f, 2f}, Tensor.ofNumbers(DType.FP32, shape(2), Arrays.asList(0.5, 2L)).toFloats(), 0f);
        assertThrows(EdgesplitException.class, () -> Tensor.ofNumbers(DType.UINT8, shape(1), Arrays.asList(256L)));
        assertThrows(EdgesplitException.class, () -> Tensor.ofNumbers(DType.INT32, shape(1), Arrays.asList(1.5)));
        assertThrows(EdgesplitException.class, () -> Tensor.ofNumbers(DType.BOOL, shape(1), Arrays.asList(1L)));
        assertThrows(EdgesplitException.class, () -> Tensor.ofNumbers(DType.FP32, shape(3), Arrays.asList(1L)));
    }

    @Test
    public void halfConversionRoundsToNearestEven() {
        assertEquals(0x3c00, Half.fromFloat(1f) & 0xffff);
        assertEquals(0xc000, Half.fromFloat(-2f) & 0xffff);
        assertEquals(0x7bff, Half.fromFloat(65504f) & 0xffff);
        assertEquals(0x7c00, Half.fromFloat(65520f) & 0xffff); // the tie above max rounds to infinity
        assertEquals(0x7bff, Half.fromFloat(65519f) & 0xffff);
        assertEquals(0xfc00, Half.fromFloat(Float.NEGATIVE_INFINITY) & 0xffff);
        assertTrue(Float.isNaN(Half.toFloat(Half.fromFloat(Float.NaN))));
        assertEquals(0x0001, Half.fromFloat(0x1p-24f) & 0xffff); // the smallest subnormal
        assertEquals(0x0000, Half.fromFloat(0x1p-26f) & 0xffff);
        assertEquals(0x8000, Half.fromFloat(-0f) & 0xffff);
        assertEquals(0x3c00, Half.fromFloat(1f + 0x1p-11f) & 0xffff); // tie, to even (down)
        assertEquals(0x3c02, Half.fromFloat(1f + 3 * 0x1p-11f) & 0xffff); // tie, to even (up)
        for (int h = 0; h < 0x10000; h++) { // every finite half survives the round trip
            if ((h & 0x7c00) != 0x7c00) {
                assertEquals(h, Half.fromFloat(Half.toFloat((short) h)) & 0xffff);
            }
        }
        assertEquals(0x1p-24f, Half.toFloat((short) 1), 0f);
        assertEquals(65504f, Half.toFloat((short) 0x7bff), 0f);
    }

    @Test
    public void npyRoundTripAndNumpyHeaders() throws Exception {
        Tensor t = Tensor.ofFloats(shape(1, 3), 1, 2, 3);
        byte[] b = Npy.encode(t);
        assertEquals(0, (10 + ((b[8] & 0xff) | (b[9] & 0xff) << 8)) % 64); // numpy aligns the data to 64
        assertEquals(t, Npy.decode(b, "t.npy"));
        for (Tensor x : new Tensor[] {Tensor.ofLongs(shape(5), 1, 2, 3, 4, 5), Tensor.ofBools(shape(), true),
            Tensor.ofHalfs(shape(2, 1), 0.5f, -1f), Tensor.ofBytes(DType.UINT8, shape(0), new byte[0])}) {
            assertEquals(x, Npy.decode(Npy.encode(x), "x.npy"));
        }
        // What numpy 1.x writes for np.save(f, np.arange(3, dtype=np.int32)), header padded to 64.
        String h = "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }";
        StringBuilder pad = new StringBuilder(h);
        while ((10 + pad.length() + 1) % 64 != 0) {
            pad.append(' ');
        }
        pad.append('\n');
        byte[] head = pad.toString().getBytes(StandardCharsets.ISO_8859_1);
        byte[] file = new byte[10 + head.length + 12];
        System.arraycopy(new byte[] {(byte) 0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (byte) head.length, 0}, 0, file, 0, 10);
        System.arraycopy(head, 0, file, 10, head.length);
        file[10 + head.length + 4] = 1;
        file[10 + head.length + 8] = 2;
        assertArrayEquals(new long[] {0, 1, 2}, Npy.decode(file, "arange.npy").toLongs());
    }

    @Test
    public void npyRefusesWhatItCannotRead() throws Exception {
        assertThrows(EdgesplitException.class, () -> Npy.decode(new byte[] {1, 2, 3}, "x"));
        byte[] big = Npy.encode(Tensor.ofBools(new long[] {1}, true));
        String s = new String(big, StandardCharsets.ISO_8859_1).replace("'|b1'", "'>f8'");
        EdgesplitException e = assertThrows(EdgesplitException.class,
                () -> Npy.decode(s.getBytes(StandardCharsets.ISO_8859_1), "be.npy"));
        assertTrue(e.getMessage(), e.getMessage().contains("be.npy: dtype >f8 is not supported"));
        String f = new String(big, StandardCharsets.ISO_8859_1).replace("False", "True ");
        e = assertThrows(EdgesplitException.class, () -> Npy.decode(f.getBytes(StandardCharsets.ISO_8859_1), "f.npy"));
        assertTrue(e.getMessage(), e.getMessage().contains("Fortran"));
    }
}
