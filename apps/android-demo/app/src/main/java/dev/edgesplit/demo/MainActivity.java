package dev.edgesplit.demo;

import ai.onnxruntime.OrtEnvironment;
import android.app.Activity;
import android.content.SharedPreferences;
import android.graphics.Bitmap;
import android.graphics.BitmapFactory;
import android.graphics.Color;
import android.os.Handler;
import android.os.Looper;
import android.view.View;
import android.widget.Button;
import android.widget.EditText;
import android.widget.ImageView;
import android.widget.TextView;
import dev.edgesplit.core.Bundle;
import dev.edgesplit.core.BundleSource;
import dev.edgesplit.core.EdgesplitException;
import dev.edgesplit.core.ImageTensors;
import dev.edgesplit.core.OipClient;
import dev.edgesplit.core.PlanRunner;
import dev.edgesplit.core.Report;
import dev.edgesplit.core.RunResult;
import dev.edgesplit.core.Tensor;
import dev.edgesplit.core.TensorSpec;
import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.util.Collections;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

/**
 * The demo's one screen: the bundle's model and plan, a picture, a server URL, and after "Run" each
 * part's processor and time beside the plan's prediction, the end-to-end latency and the top
 * classes. Every failure of the core (a malformed manifest, a checksum mismatch, a server error)
 * arrives as an {@link EdgesplitException} and is shown with its one-line message.
 *
 * <p>The bundle comes from the app's files folder when one was pushed there
 * ({@code /sdcard/Android/data/dev.edgesplit.demo/files/bundle/}), else from the APK's assets.
 */
public class MainActivity extends Activity {
    private static final int CONNECT_TIMEOUT_MS = 3_000;
    private static final int READ_TIMEOUT_MS = 10_000;

    private final ExecutorService worker = Executors.newSingleThreadExecutor();
    private final Handler main = new Handler(Looper.getMainLooper());
    private OrtEnvironment env;
    private Bundle bundle;
    private Bitmap picture;
    private PlanRunner runner;
    private AndroidExecutors executors;
    private String runnerKey;

    private EditText serverUrl;
    private EditText token;
    private Button runButton;
    private TextView status;
    private TextView report;

    @Override
    protected void onCreate(android.os.Bundle state) {
        super.onCreate(state);
        setContentView(R.layout.activity_main);
        serverUrl = findViewById(R.id.server_url);
        token = findViewById(R.id.token);
        runButton = findViewById(R.id.run);
        status = findViewById(R.id.status);
        report = findViewById(R.id.report);
        SharedPreferences prefs = getPreferences(MODE_PRIVATE);
        serverUrl.setText(prefs.getString("server_url", ""));
        token.setText(prefs.getString("token", ""));
        runButton.setEnabled(false);
        runButton.setOnClickListener(this::onRun);
        showStatus(getString(R.string.checking_bundle), false);
        worker.execute(this::load);
    }

    /** Opens the bundle (every checksum) and the picture, off the UI thread. */
    private void load() {
        try {
            env = OrtEnvironment.getEnvironment();
            File files = getExternalFilesDir(null) != null ? getExternalFilesDir(null) : getFilesDir();
            File pushed = new File(files, "bundle");
            BundleSource source = new File(pushed, Bundle.MANIFEST).isFile()
                    ? BundleSource.directory(pushed) : new AssetBundleSource(getAssets(), "bundle");
            bundle = Bundle.open(source);
            picture = loadPicture(files);
            final String header = Report.header(bundle.manifest);
            final String where = source.describe("");
            main.post(() -> {
                ((ImageView) findViewById(R.id.picture)).setImageBitmap(picture);
                report.setText(header);
                showStatus(getString(R.string.bundle_ok, bundle.files().size(), where), false);
                runButton.setEnabled(true);
            });
        } catch (EdgesplitException e) {
            fail(e);
        } catch (IOException | RuntimeException e) {
            fail(e);
        }
    }

    private Bitmap loadPicture(File filesDir) throws IOException {
        File pushed = new File(filesDir, "picture.png");
        if (pushed.isFile()) {
            Bitmap b = BitmapFactory.decodeFile(pushed.getPath());
            if (b != null) {
                return b;
            }
        }
        try (InputStream in = getAssets().open("picture.png")) {
            Bitmap b = BitmapFactory.decodeStream(in);
            if (b == null) {
                throw new IOException("assets/picture.png is not an image");
            }
            return b;
        }
    }

    private void onRun(View v) {
        final String url = serverUrl.getText().toString().trim();
        final String tok = token.getText().toString().trim();
        getPreferences(MODE_PRIVATE).edit().putString("server_url", url).putString("token", tok).apply();
        runButton.setEnabled(false);
        showStatus(getString(R.string.running), false);
        worker.execute(() -> run(url, tok));
    }

    /** One inference, off the UI thread: builds the executors when the server changed, then runs. */
    private void run(String url, String tok) {
        try {
            String key = url + "\n" + tok;
            if (runner == null || !key.equals(runnerKey)) {
                if (runner != null) {
                    runner.close();
                    runner = null;
                }
                OipClient client = url.isEmpty() ? null : new OipClient(url, tok, CONNECT_TIMEOUT_MS, READ_TIMEOUT_MS);
                executors = new AndroidExecutors(env, bundle, client);
                runner = new PlanRunner(bundle.manifest, executors);
                runnerKey = key;
            }
            TensorSpec in = bundle.manifest.inputs.get(0);
            int w = picture.getWidth();
            int h = picture.getHeight();
            int[] px = new int[w * h];
            picture.getPixels(px, 0, w, 0, 0, w, h);
            Map<String, Tensor> feeds = Collections.singletonMap(in.name,
                    ImageTensors.fromArgb(px, w, h, in, ImageTensors.IMAGENET_MEAN, ImageTensors.IMAGENET_STD));
            RunResult r = runner.run(feeds);
            final String text = Report.header(bundle.manifest) + "\n" + Report.run(bundle.manifest, r)
                    + notes() + "\n" + classes(r);
            main.post(() -> {
                report.setText(text);
                showStatus(getString(R.string.ran, r.totalMs), false);
                runButton.setEnabled(true);
            });
        } catch (EdgesplitException e) {
            fail(e);
        } catch (RuntimeException e) {
            fail(e);
        }
    }

    private String notes() {
        StringBuilder b = new StringBuilder();
        for (String n : executors.notes()) {
            b.append("note: ").append(n).append('\n');
        }
        return b.toString();
    }

    /** The top classes of the first output, when it is a float vector of scores. */
    private String classes(RunResult r) {
        Tensor logits = r.outputs.values().iterator().next();
        if (logits.dtype != dev.edgesplit.core.DType.FP32) {
            return "";
        }
        float[] p = Report.softmax(logits.toFloats());
        StringBuilder b = new StringBuilder(getString(R.string.top_classes)).append('\n');
        for (int c : Report.topK(p, 3)) {
            b.append(String.format(Locale.ROOT, "  class %d  %.1f %%%n", c, 100 * p[c]));
        }
        return b.toString();
    }

    private void fail(EdgesplitException e) {
        final String title = e.kind().title;
        final String message = e.getMessage();
        main.post(() -> {
            showStatus(title + ": " + message, true);
            runButton.setEnabled(bundle != null);
        });
    }

    private void fail(Exception e) {
        final String message = getString(R.string.unexpected_error, e.toString());
        main.post(() -> {
            showStatus(message, true);
            runButton.setEnabled(bundle != null);
        });
    }

    private void showStatus(String text, boolean error) {
        status.setText(text);
        status.setTextColor(error ? Color.rgb(0xb0, 0x00, 0x20) : Color.DKGRAY);
    }

    @Override
    protected void onDestroy() {
        worker.shutdownNow();
        if (runner != null) {
            runner.close();
        }
        super.onDestroy();
    }
}
