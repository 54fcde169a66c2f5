package io.gpumemd.it.deploy;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.config.ConfigException;
import io.gpumemd.server.config.ServerConfig;
import java.io.ByteArrayInputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import javax.xml.parsers.DocumentBuilderFactory;
import org.junit.jupiter.api.Test;
import org.w3c.dom.Document;
import org.w3c.dom.NodeList;

/**
 * deploy/Dockerfile says what it builds and how the image runs; these tests hold it to the
 * Maven build and to the daemon's own flag parser (no container engine needed).
 */
class DockerfileTest {
  private final GpumemdImage image = new GpumemdImage();

  @Test
  void stages_mavenBuildThenJreRuntime() {
    List<ParsedDockerfile.Stage> stages = image.dockerfile.stages();
    assertEquals(2, stages.size(), "stages");
    assertEquals("maven:3.9-eclipse-temurin-17", stages.get(0).image());
    assertEquals("build", stages.get(0).name());
    assertEquals("eclipse-temurin:17-jre", stages.get(1).image());
  }

  @Test
  void buildStage_copiesEveryMavenModuleAndRunsPackage() {
    ParsedDockerfile.Stage build = image.dockerfile.stage("build");
    List<String> copied = new ArrayList<>();
    build.all("COPY").forEach(c -> copied.add(c.words().get(0)));
    for (String module : modules(RepoFiles.read("pom.xml"))) {
      if (module.equals("it")) {
        continue; // tests only: the image build skips it (-pl)
      }
      assertTrue(copied.contains(module), "the build stage copies module " + module + " (copies " + copied + ")");
    }
    assertTrue(copied.contains("pom.xml"), "the build stage copies the parent pom");
    String run = build.last("RUN").args();
    assertTrue(run.contains("mvn ") && run.contains(" package"), "the build stage runs mvn package: " + run);
  }

  @Test
  void runtimeCopies_theJarsTheMavenBuildProduces() {
    String workdir = image.dockerfile.stage("build").last("WORKDIR").args();
    List<String> sources = new ArrayList<>();
    for (ParsedDockerfile.Instruction copy : image.runtime.all("COPY")) {
      List<String> words = copy.words();
      assertEquals("--from=build", words.get(0), "runtime COPY takes from the build stage: " + copy.args());
      sources.add(Path.of(workdir).relativize(Path.of(words.get(1))).toString());
    }
    String server = "server/target/" + finalName("server/pom.xml") + ".jar";
    assertEquals("server/target/gpumemd.jar", server, "what the server module's shade execution writes");
    assertTrue(sources.contains(server), "COPY " + server + " (copies " + sources + ")");
    assertTrue(sources.contains("ctl/target/gpumemctl.jar"), "COPY ctl/target/gpumemctl.jar (copies " + sources + ")");
  }

  @Test
  void ctlModule_buildsGpumemctlJar() {
    // The shade plugin's outputFile names the jar (the module's own artifact stays the plain jar).
    assertTrue(RepoFiles.read("ctl/pom.xml").contains(
        "<outputFile>${project.build.directory}/gpumemctl.jar</outputFile>"),
        "ctl/pom.xml shades ctl/target/gpumemctl.jar, which the Dockerfile copies");
    assertTrue(RepoFiles.read("ctl/pom.xml").contains("<mainClass>io.gpumemd.ctl.GpuMemCtl</mainClass>"),
        "gpumemctl.jar runs io.gpumemd.ctl.GpuMemCtl");
    assertFalse(RepoFiles.read("client/pom.xml").contains("maven-shade-plugin"),
        "the client module builds the library only");
  }

  @Test
  void runtime_runsAsNumericNonRootUser() {
    // numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd
    assertTrue(image.user().matches("\\d+(:\\d+)?"), "USER is numeric: " + image.user());
    assertTrue(image.uid() != 0, "USER is not root: " + image.user());
    String setup = image.runtime.all("RUN").get(0).args();
    assertTrue(setup.contains("--uid " + image.uid()) && setup.contains("--gid " + image.gid()),
        "the runtime stage creates user " + image.uid() + " and group " + image.gid() + ": " + setup);
  }

  @Test
  void entrypoint_runsTheCopiedDaemonJarWithContainerListeners() {
    assertEquals("java", image.entrypoint().get(0));
    List<String> copied = new ArrayList<>();
    image.runtime.all("COPY").forEach(c -> copied.add(c.words().get(2)));
    assertTrue(copied.contains(image.daemonJar()), "ENTRYPOINT runs a copied jar: " + image.daemonJar());

    ServerConfig config = image.config(List.of());
    assertEquals(Path.of("/run/gpumemd/gpumemd.sock"), config.listeners().socket());
    assertFalse(config.listeners().tcpEnabled(), "no TCP listener: gRPC on the socket only, health checks included");
    assertTrue(image.volumes().contains(config.listeners().socket().getParent().toString()), "the socket's directory is a VOLUME");
    assertTrue(image.volumes().contains(config.backend().shmDir().toString()), "the shm directory is a VOLUME: " + config.backend().shmDir());
    assertEquals(List.of(config.listeners().metricsPort()), image.exposedPorts(), "EXPOSE metrics only");
    assertEquals(List.of(9464), image.exposedPorts());
  }

  @Test
  void tcpOnEveryInterface_isRefusedWithoutTls_asTheCommentsSay() {
    assertThrows(ConfigException.class, () -> image.config(List.of("--listen", "0.0.0.0:50051")));
    assertTrue(image.config(List.of("--listen", "0.0.0.0:50051", "--insecure-tcp")).security().insecureTcp());
    String comments = RepoFiles.read(GpumemdImage.DOCKERFILE);
    assertTrue(comments.contains("--listen 0.0.0.0:50051 --tls-cert"), "the Dockerfile says how to enable TCP with TLS");
  }

  @Test
  void entrypointFlags_canBeOverriddenByArguments() {
    ServerConfig config = image.config(List.of("--listen", "127.0.0.1:6000", "--backend", "host"));
    assertEquals("127.0.0.1", config.listeners().listenHost());
    assertEquals(6000, config.listeners().listenPort());
    assertEquals("host", config.backend().kind());
  }

  @Test
  void runtime_setsNvidiaContainerToolkitVariables() {
    Map<String, String> env = image.runtime.env();
    assertEquals("all", env.get("NVIDIA_VISIBLE_DEVICES"));
    assertTrue(List.of(env.getOrDefault("NVIDIA_DRIVER_CAPABILITIES", "").split(",")).containsAll(List.of("compute", "utility")),
        "NVIDIA_DRIVER_CAPABILITIES has compute (libcuda) and utility: " + env);
  }

  @Test
  void dockerignore_keepsBuildOutputsOutOfTheContext() {
    List<String> patterns = RepoFiles.read(".dockerignore").lines().map(String::trim)
        .filter(l -> !l.isEmpty() && !l.startsWith("#")).toList();
    assertTrue(patterns.contains("**/target"), "**/target ignored: " + patterns);
    assertTrue(patterns.contains(".git"), ".git ignored: " + patterns);
    assertFalse(patterns.stream().anyMatch(p -> p.equals("deploy") || p.equals("server") || p.equals("pom.xml")),
        "nothing the build needs is ignored: " + patterns);
  }

  private static List<String> modules(String pom) {
    List<String> out = new ArrayList<>();
    NodeList nodes = xml(pom).getElementsByTagName("module");
    for (int i = 0; i < nodes.getLength(); i++) {
      out.add(nodes.item(i).getTextContent().trim());
    }
    assertFalse(out.isEmpty(), "the parent pom lists modules");
    return out;
  }

  /** The single finalName a module's pom declares (its shaded jar's name), or null. */
  private static String finalName(String pomPath) {
    NodeList nodes = xml(RepoFiles.read(pomPath)).getElementsByTagName("finalName");
    if (nodes.getLength() == 0) {
      return null;
    }
    assertEquals(1, nodes.getLength(), pomPath + " declares one finalName");
    return nodes.item(0).getTextContent().trim();
  }

  private static Document xml(String text) {
    try {
      return DocumentBuilderFactory.newInstance().newDocumentBuilder()
          .parse(new ByteArrayInputStream(text.getBytes(StandardCharsets.UTF_8)));
    } catch (Exception e) {
      throw new AssertionError("unparseable pom: " + e, e);
    }
  }
}
