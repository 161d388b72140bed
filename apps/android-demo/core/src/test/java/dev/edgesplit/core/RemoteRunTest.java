package dev.edgesplit.core;

import static org.junit.Assert.assertEquals;

import java.io.File;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

public class RemoteRunTest {
    @Rule
    public TemporaryFolder tmp = new TemporaryFolder();

    @Test
    public void exitCodesFollowTheCli() throws Exception {
        File dir = Fixtures.writeBundle(tmp.newFolder("b"), Fixtures.diamond());
        assertEquals(2, RemoteRun.run(new String[] {}));
        assertEquals(2, RemoteRun.run(new String[] {"--bundle"}));
        assertEquals(2, RemoteRun.run(new String[] {"--bundle", dir.getPath(), "--bogus", "1"}));
        assertEquals(0, RemoteRun.run(new String[] {"--bundle", dir.getPath(), "--check"}));
        Fixtures.write(new File(dir, "parts/p0.onnx"), new byte[] {0});
        assertEquals(2, RemoteRun.run(new String[] {"--bundle", dir.getPath(), "--check"}));
    }

    @Test
    public void safeNamesAndTimings() throws Exception {
        assertEquals("a_b_c.d-e", RemoteRun.safeName("a/b:c.d-e"));
        RunResult r = new RunResult(Collections.<String, Tensor>emptyMap(), Arrays.asList(
                new PartTiming("p0", "big", "server http://x", 0.5, 1.25, null, false, "")), 2.0);
        Map<?, ?> doc = (Map<?, ?>) Json.parse(RemoteRun.timingsJson(r));
        assertEquals(2L, doc.get("total_ms"));
        Map<?, ?> p0 = (Map<?, ?>) ((List<?>) doc.get("parts")).get(0);
        assertEquals(1.25, p0.get("latency_ms"));
        assertEquals(null, p0.get("predicted_ms"));
        assertEquals(false, p0.get("fell_back"));
    }
}
