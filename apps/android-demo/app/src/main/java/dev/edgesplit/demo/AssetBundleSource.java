package dev.edgesplit.demo;

import android.content.res.AssetManager;
import dev.edgesplit.core.BundleSource;
import java.io.IOException;
import java.io.InputStream;

/** A bundle packed in the APK's assets, under {@code assets/<folder>/}. */
final class AssetBundleSource implements BundleSource {
    private final AssetManager assets;
    private final String folder;

    AssetBundleSource(AssetManager assets, String folder) {
        this.assets = assets;
        this.folder = folder;
    }

    @Override
    public InputStream open(String relPath) throws IOException {
        // AssetManager.open throws FileNotFoundException for a missing asset, as the contract asks.
        return assets.open(folder + "/" + relPath);
    }

    @Override
    public String describe(String relPath) {
        return "assets/" + folder + "/" + relPath;
    }
}
