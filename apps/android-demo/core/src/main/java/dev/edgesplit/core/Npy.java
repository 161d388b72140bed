package dev.edgesplit.core;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * numpy's {@code .npy} format (versions 1 to 3, C order, little-endian) for the core's types: how
 * inputs and outputs travel between the Java core and Python in tests and on the command line.
 */
public final class Npy {
    private static final byte[] MAGIC = {(byte) 0x93, 'N', 'U', 'M', 'P', 'Y'};
    private static final Pattern DESCR = Pattern.compile("'descr'\\s*:\\s*'([^']*)'");
    private static final Pattern FORTRAN = Pattern.compile("'fortran_order'\\s*:\\s*(True|False)");
    private static final Pattern SHAPE = Pattern.compile("'shape'\\s*:\\s*\\(([^)]*)\\)");

    private Npy() {
    }

    /** Encodes a tensor as a version 1.0 {@code .npy} file. */
    public static byte[] encode(Tensor t) {
        StringBuilder shape = new StringBuilder();
        long[] dims = t.shape();
        for (long d : dims) {
            shape.append(d).append(", ");
        }
        if (dims.length > 1) {
            shape.setLength(shape.length() - 2);
        } else if (dims.length == 1) {
            shape.setLength(shape.length() - 1);
        }
        String dict = "{'descr': '" + t.dtype.npyDescr + "', 'fortran_order': False, 'shape': (" + shape + "), }";
        int unpadded = MAGIC.length + 2 + 2 + dict.length() + 1;
        int pad = (64 - unpadded % 64) % 64;
        StringBuilder h = new StringBuilder(dict);
        for (int k = 0; k < pad; k++) {
            h.append(' ');
        }
        h.append('\n');
        byte[] header = h.toString().getBytes(StandardCharsets.ISO_8859_1);
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        out.write(MAGIC, 0, MAGIC.length);
        out.write(1);
        out.write(0);
        out.write(header.length & 0xff);
        out.write(header.length >> 8);
        out.write(header, 0, header.length);
        byte[] data = t.bytes();
        out.write(data, 0, data.length);
        return out.toByteArray();
    }

    /**
     * Decodes a {@code .npy} file.
     *
     * @throws EdgesplitException (INPUT) naming {@code what} when the file is not a .npy the core reads
     */
    public static Tensor decode(byte[] b, String what) throws EdgesplitException {
        if (b.length < 10) {
            throw EdgesplitException.input(what + ": not a .npy file (too short)");
        }
        for (int k = 0; k < MAGIC.length; k++) {
            if (b[k] != MAGIC[k]) {
                throw EdgesplitException.input(what + ": not a .npy file (no magic)");
            }
        }
        int major = b[6];
        int hlen;
        int start;
        if (major == 1) {
            hlen = (b[8] & 0xff) | (b[9] & 0xff) << 8;
            start = 10;
        } else if (major == 2 || major == 3) {
            if (b.length < 12) {
                throw EdgesplitException.input(what + ": truncated .npy header");
            }
            hlen = (b[8] & 0xff) | (b[9] & 0xff) << 8 | (b[10] & 0xff) << 16 | (b[11] & 0xff) << 24;
            start = 12;
        } else {
            throw EdgesplitException.input(what + ": .npy version " + major + " is not supported");
        }
        if (hlen < 0 || start + hlen > b.length) {
            throw EdgesplitException.input(what + ": truncated .npy header");
        }
        String header = new String(b, start, hlen, major == 3 ? StandardCharsets.UTF_8 : StandardCharsets.ISO_8859_1);
        Matcher d = DESCR.matcher(header);
        Matcher f = FORTRAN.matcher(header);
        Matcher s = SHAPE.matcher(header);
        if (!d.find() || !f.find() || !s.find()) {
            throw EdgesplitException.input(what + ": malformed .npy header " + header.trim());
        }
        DType dtype = DType.fromNpy(d.group(1));
        if (dtype == null) {
            throw EdgesplitException.input(what + ": dtype " + d.group(1) + " is not supported (the core reads "
                    + DType.supportedNumpy() + ", little-endian)");
        }
        if (f.group(1).equals("True")) {
            throw EdgesplitException.input(what + ": Fortran-ordered arrays are not supported");
        }
        List<Long> dims = new ArrayList<>();
        for (String part : s.group(1).split(",")) {
            if (!part.trim().isEmpty()) {
                try {
                    dims.add(Long.parseLong(part.trim()));
                } catch (NumberFormatException e) {
                    throw EdgesplitException.input(what + ": bad shape (" + s.group(1) + ")");
                }
            }
        }
        long[] shape = new long[dims.size()];
        for (int k = 0; k < shape.length; k++) {
            shape[k] = dims.get(k);
        }
        int from = start + hlen;
        byte[] data = new byte[b.length - from];
        System.arraycopy(b, from, data, 0, data.length);
        try {
            return Tensor.ofBytes(dtype, shape, data);
        } catch (EdgesplitException e) {
            throw EdgesplitException.input(what + ": " + e.getMessage());
        }
    }

    public static Tensor read(File f) throws EdgesplitException {
        try (InputStream in = new FileInputStream(f)) {
            return decode(Bundle.readAll(in), f.getPath());
        } catch (IOException e) {
            throw new EdgesplitException(EdgesplitException.Kind.INPUT, f + ": cannot be read (" + e + ")", e);
        }
    }

    /** Writes {@code t} to {@code f} atomically (a temporary file beside it, then a rename). */
    public static void write(File f, Tensor t) throws IOException {
        File tmp = new File(f.getPath() + ".tmp");
        try (OutputStream out = new FileOutputStream(tmp)) {
            out.write(encode(t));
        }
        if (!tmp.renameTo(f)) {
            tmp.delete();
            throw new IOException("cannot write " + f);
        }
    }
}
