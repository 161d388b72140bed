package dev.edgesplit.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.io.File;
import java.nio.charset.StandardCharsets;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

public class BundleTest {
    @Rule
    public TemporaryFolder tmp = new TemporaryFolder();

    private File bundle() throws Exception {
        return Fixtures.writeBundle(tmp.newFolder("bundle"), Fixtures.diamond());
    }

    private static EdgesplitException fails(File dir) {
        EdgesplitException e = assertThrows(EdgesplitException.class, () -> Bundle.open(BundleSource.directory(dir)));
        assertEquals(EdgesplitException.Kind.BUNDLE, e.kind());
        return e;
    }

    @Test
    public void sha256IsHex() {
        assertEquals("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", Bundle.sha256(new byte[0]));
        assertEquals("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
                Bundle.sha256("abc".getBytes(StandardCharsets.US_ASCII)));
    }

    @Test
    public void opensAndReadsVerifiedBytes() throws Exception {
        Bundle b = Bundle.open(BundleSource.directory(bundle()));
        assertEquals(4, b.manifest.parts.size());
        assertArrayEquals(Fixtures.files().get("parts/p2.onnx"), b.read("parts/p2.onnx"));
        EdgesplitException e = assertThrows(EdgesplitException.class, () -> b.read("parts/other.onnx"));
        assertTrue(e.getMessage(), e.getMessage().endsWith("parts/other.onnx: not listed in the manifest"));
    }

    @Test
    public void tamperedPartIsNamed() throws Exception {
        File dir = bundle();
        File p1 = new File(dir, "parts/p1.onnx");
        Fixtures.write(p1, "model bytes of p1!".getBytes(StandardCharsets.UTF_8));
        EdgesplitException e = fails(dir);
        assertEquals(p1.getPath() + ": checksum mismatch (the file was changed after compile)", e.getMessage());
        assertTrue(e.userMessage().startsWith("Bundle problem: "));
    }

    @Test
    public void changedAfterOpeningIsCaughtOnRead() throws Exception {
        File dir = bundle();
        Bundle b = Bundle.open(BundleSource.directory(dir));
        Fixtures.write(new File(dir, "parts/p0.onnx"), new byte[] {1, 2, 3});
        EdgesplitException e = assertThrows(EdgesplitException.class, () -> b.read("parts/p0.onnx"));
        assertTrue(e.getMessage(), e.getMessage().contains("checksum mismatch"));
    }

    @Test
    public void missingFileIsNamed() throws Exception {
        File dir = bundle();
        File p3 = new File(dir, "parts/p3.onnx");
        assertTrue(p3.delete());
        assertEquals(p3.getPath() + ": missing from the bundle", fails(dir).getMessage());
    }

    @Test
    public void missingOrBrokenManifest() throws Exception {
        File dir = tmp.newFolder("empty");
        assertEquals(new File(dir, "manifest.json").getPath() + ": missing; this is not a bundle", fails(dir).getMessage());
        Fixtures.write(new File(dir, "manifest.json"), "{\"format_version\": 1".getBytes(StandardCharsets.UTF_8));
        assertTrue(fails(dir).getMessage().contains("not a JSON manifest"));
    }
}
