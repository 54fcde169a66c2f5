package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.pool.PoolStats;
import io.gpumemd.server.testing.TestDaemon;
import java.io.IOException;
import java.io.StringWriter;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The Java examples of the README compile as shown, imports and all, and do what they say
 * against a live daemon: "Use it from Java" leases 64 MiB zeroed with tag {@code kv-cache},
 * writes to it, and gives it back; "Sharing memory between processes" shares a block one-shot
 * and attaches to it, publishes one read-only and looks it up, and leaves nothing held.
 */
class ReadmeExampleTest {
  private static final Pattern JAVA_BLOCK =
      Pattern.compile("## Use it from Java\\s+```java\\n(.*?)```", Pattern.DOTALL);
  private static final Pattern SHARING_BLOCK =
      Pattern.compile("### Sharing memory between processes\\s+[^`]*```java\\n(.*?)```", Pattern.DOTALL);

  @TempDir
  Path dir;

  static String example() throws IOException {
    return example(JAVA_BLOCK, "'Use it from Java'");
  }

  static String example(Pattern block, String heading) throws IOException {
    Path readme = Path.of("").toAbsolutePath();
    while (!Files.exists(readme.resolve("README.md")) || !Files.isDirectory(readme.resolve("client"))) {
      readme = readme.getParent();
      assertNotNull(readme, "no README.md above the working directory");
    }
    Matcher m = block.matcher(Files.readString(readme.resolve("README.md")));
    assertTrue(m.find(), "README.md has a ```java block under " + heading);
    return m.group(1);
  }

  @Test
  void readmeJavaExample_compilesAsShown_andLeasesFromTheDaemon() throws Exception {
    // The GPU bundle's jlink'd runtime carries no compiler (7 MiB of the carry limit); every
    // JDK, CI's included, does.
    assumeTrue(ModuleLayer.boot().findModule("java.compiler").isPresent(),
        "README example test skipped: this runtime has no java.compiler module (a jlink'd JRE)");
    compile(example());

    try (TestDaemon daemon = TestDaemon.start();
         URLClassLoader loader = new URLClassLoader(new URL[] {dir.toUri().toURL()}, getClass().getClassLoader())) {
      loader.loadClass("readme.Example").getMethod("run", String.class).invoke(null, daemon.unixTarget());
      PoolStats stats = daemon.server().pools().get(0).stats();
      assertEquals(1, stats.get(PoolMetric.MISSES), "the example leased once");
      assertEquals(1, stats.get(PoolMetric.RETURNS), "and gave the lease back");
      assertEquals(64L << 20, stats.get(PoolMetric.PEAK_LEASED_BYTES));
      assertEquals(0, stats.get(PoolMetric.LEASED_BYTES));
    }
  }

  /** Compiles a README example as {@code readme.Example.run(String target)} into {@link #dir}. */
  private void compile(String example) throws IOException {
    StringBuilder imports = new StringBuilder();
    StringBuilder body = new StringBuilder();
    for (String line : example.split("\n")) {
      (line.startsWith("import ") ? imports : body).append(line).append('\n');
    }
    String source = "package readme;\n" + imports
        + "public final class Example {\n  public static void run(String target) throws Exception {\n"
        + body.toString().replace("\"unix:///tmp/gpumemd.sock\"", "target") + "  }\n}\n";
    assertTrue(source.contains("(target)"), "the example connects to unix:///tmp/gpumemd.sock");
    Path file = dir.resolve("readme/Example.java");
    Files.createDirectories(file.getParent());
    Files.writeString(file, source);

    JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
    StringWriter diagnostics = new StringWriter();
    boolean compiled = javac.getTask(diagnostics, null, null,
        List.of("-classpath", System.getProperty("java.class.path"), "-d", dir.toString()), null,
        javac.getStandardFileManager(null, null, null).getJavaFileObjects(file)).call();
    assertTrue(compiled, "the README's Java example does not compile:\n" + diagnostics + "\n" + source);
  }

  @Test
  void readmeSharingExample_compilesAsShown_andSharesAttachesPublishesAndLooksUp() throws Exception {
    assumeTrue(ModuleLayer.boot().findModule("java.compiler").isPresent(),
        "README example test skipped: this runtime has no java.compiler module (a jlink'd JRE)");
    compile(example(SHARING_BLOCK, "'Sharing memory between processes'"));
    try (TestDaemon daemon = TestDaemon.start();
         URLClassLoader loader = new URLClassLoader(new URL[] {dir.toUri().toURL()}, getClass().getClassLoader())) {
      loader.loadClass("readme.Example").getMethod("run", String.class).invoke(null, daemon.unixTarget());
      PoolStats stats = daemon.server().pools().get(0).stats();
      assertEquals(1, stats.get(PoolMetric.SHARES), "the example shared once");
      assertEquals(2, stats.get(PoolMetric.ATTACHES), "attached once, looked up once");
      assertEquals(0, stats.get(PoolMetric.PUBLISHED_OBJECTS), "and unpublished");
      assertEquals(0, stats.get(PoolMetric.LIVE_HOLDS));
      long deadline = System.nanoTime() + 5_000_000_000L;
      while (stats.get(PoolMetric.LEASED_BYTES) != 0 && System.nanoTime() < deadline) {
        Thread.sleep(5);
        stats = daemon.server().pools().get(0).stats();
      }
      assertEquals(0, stats.get(PoolMetric.LEASED_BYTES), "every block back");
      daemon.verifyInvariants();
    }
  }
}
