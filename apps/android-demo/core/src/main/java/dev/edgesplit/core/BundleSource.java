package dev.edgesplit.core;

import java.io.File;
import java.io.FileInputStream;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;

/**
 * Where a bundle's files come from: a folder ({@link #directory}), or on Android the app's assets.
 * Paths are the manifest's relative paths with '/' separators, already checked to stay inside.
 */
public interface BundleSource {
    /**
     * Opens a file of the bundle.
     *
     * @throws FileNotFoundException when the bundle has no such file
     */
    InputStream open(String relPath) throws IOException;

    /** How messages name a file of the bundle: its full path, or {@code assets/bundle/...}. */
    String describe(String relPath);

    /** A bundle in a folder. */
    static BundleSource directory(final File root) {
        return new BundleSource() {
            @Override
            public InputStream open(String relPath) throws IOException {
                File f = new File(root, relPath);
                if (!f.isFile()) {
                    throw new FileNotFoundException(f.getPath());
                }
                return new FileInputStream(f);
            }

            @Override
            public String describe(String relPath) {
                return new File(root, relPath).getPath();
            }
        };
    }
}
