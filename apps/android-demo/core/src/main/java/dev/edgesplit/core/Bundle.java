package dev.edgesplit.core;

import java.io.ByteArrayOutputStream;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Map;

/**
 * An opened bundle: its manifest, with every file's sha256 checked against it.
 *
 * <p>{@link #open} verifies every file before anything is used. {@link #read} checks the bytes it
 * returns once more, so what ONNX Runtime loads is exactly what was verified, even if the file
 * changed after opening.
 */
public final class Bundle {
    public static final String MANIFEST = "manifest.json";

    public final Manifest manifest;
    private final BundleSource source;

    private Bundle(Manifest manifest, BundleSource source) {
        this.manifest = manifest;
        this.source = source;
    }

    /**
     * Reads and checks the manifest, then the sha256 of every file it lists.
     *
     * @throws EdgesplitException (BUNDLE) naming the file at fault: a missing or malformed manifest,
     *     another format version, a missing file, or a checksum mismatch (a tampered file)
     */
    public static Bundle open(BundleSource source) throws EdgesplitException {
        byte[] text = readOrFail(source, MANIFEST, "missing; this is not a bundle");
        Manifest m = Manifest.parse(new String(text, StandardCharsets.UTF_8), source.describe(MANIFEST));
        Bundle b = new Bundle(m, source);
        for (String rel : m.files.keySet()) {
            b.verify(rel);
        }
        return b;
    }

    /** A file's bytes; a missing or unreadable file is a BUNDLE error naming it. */
    private static byte[] readOrFail(BundleSource source, String rel, String whenMissing)
            throws EdgesplitException {
        try {
            return readAll(source, rel);
        } catch (FileNotFoundException e) {
            throw new EdgesplitException(EdgesplitException.Kind.BUNDLE, source.describe(rel) + ": " + whenMissing, e);
        } catch (IOException e) {
            throw new EdgesplitException(EdgesplitException.Kind.BUNDLE,
                    source.describe(rel) + ": cannot be read (" + e + ")", e);
        }
    }

    /**
     * The bytes of a bundle file, checked against the manifest's sha256.
     *
     * @throws EdgesplitException (BUNDLE) when the file is not in the manifest, is missing, or differs
     */
    public byte[] read(String relPath) throws EdgesplitException {
        String want = manifest.files.get(relPath);
        if (want == null) {
            throw EdgesplitException.bundle(source.describe(relPath) + ": not listed in the manifest");
        }
        byte[] data = readOrFail(source, relPath, "missing from the bundle");
        if (!sha256(data).equals(want)) {
            throw EdgesplitException.bundle(source.describe(relPath)
                    + ": checksum mismatch (the file was changed after compile)");
        }
        return data;
    }

    /** Streams a file through SHA-256 and compares (no copy of a large model in memory). */
    private void verify(String relPath) throws EdgesplitException {
        MessageDigest md = digest();
        try (InputStream in = source.open(relPath)) {
            byte[] buf = new byte[1 << 16];
            int n;
            while ((n = in.read(buf)) > 0) {
                md.update(buf, 0, n);
            }
        } catch (FileNotFoundException e) {
            throw new EdgesplitException(EdgesplitException.Kind.BUNDLE,
                    source.describe(relPath) + ": missing from the bundle", e);
        } catch (IOException e) {
            throw new EdgesplitException(EdgesplitException.Kind.BUNDLE,
                    source.describe(relPath) + ": cannot be read (" + e + ")", e);
        }
        if (!hex(md.digest()).equals(manifest.files.get(relPath))) {
            throw EdgesplitException.bundle(source.describe(relPath)
                    + ": checksum mismatch (the file was changed after compile)");
        }
    }

    /** Every file and its sha256, as the manifest lists them. */
    public Map<String, String> files() {
        return manifest.files;
    }

    /** Lower-case hex SHA-256 of {@code data}. */
    public static String sha256(byte[] data) {
        return hex(digest().digest(data));
    }

    private static MessageDigest digest() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("this Java has no SHA-256", e);
        }
    }

    private static String hex(byte[] d) {
        StringBuilder b = new StringBuilder(64);
        for (byte x : d) {
            b.append(Character.forDigit((x >> 4) & 0xf, 16)).append(Character.forDigit(x & 0xf, 16));
        }
        return b.toString();
    }

    static byte[] readAll(BundleSource source, String rel) throws IOException {
        try (InputStream in = source.open(rel)) {
            return readAll(in);
        }
    }

    static byte[] readAll(InputStream in) throws IOException {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        byte[] buf = new byte[1 << 16];
        int n;
        while ((n = in.read(buf)) > 0) {
            out.write(buf, 0, n);
        }
        return out.toByteArray();
    }
}
