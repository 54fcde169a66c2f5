package io.gpumemd.it.deploy;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.gson.JsonArray;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.Descriptors.MethodDescriptor;
import com.google.protobuf.Descriptors.ServiceDescriptor;
import io.gpumemd.client.Channels;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.server.config.ServerConfig;
import io.gpumemd.server.testing.TestDaemon;
import java.io.IOException;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * The operator's view from deploy/README.md, against a real daemon: every grpcurl command the
 * README shows runs through server reflection (what grpcurl uses) over TCP and over the Unix
 * socket, and the README's metric table matches what /metrics serves.
 */
class GrpcurlExamplesTest {
  private static final long MIB = 1L << 20;
  private static TestDaemon daemon;

  @BeforeAll
  static void startDaemonWithTraffic() throws IOException {
    daemon = TestDaemon.start("--metrics-host", "127.0.0.1", "--metrics-port", Integer.toString(freePort()));
    // a miss, a return, then a hit, so GetStats has counters to show (unary calls: the daemon
    // serves both leases, the client keeps no cache)
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).unaryCalls(true).connect()) {
      try (Lease first = client.lease(0, MIB)) {
        assertEquals(MIB, first.sizeBytes());
      }
      try (Lease second = client.lease(0, MIB)) {
        assertTrue(second.poolHit(), "the second lease is served from the cache");
      }
    }
  }

  @AfterAll
  static void stopDaemon() {
    if (daemon != null) {
      daemon.close();
    }
  }

  @ParameterizedTest
  @ValueSource(strings = {"tcp", "unix"})
  void list_namesTheGpumemdHealthAndReflectionServices(String transport) {
    try (Channels.Connection connection = Channels.open(target(transport))) {
      List<String> services = new ReflectionGrpcurl(connection.channel()).listServices();
      assertTrue(services.containsAll(List.of("gpumemd.v1.Allocator", "gpumemd.v1.Admin", "grpc.health.v1.Health",
          "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")), "list: " + services);
    }
  }

  @ParameterizedTest
  @ValueSource(strings = {"tcp", "unix"})
  void describeAdmin_showsGetStatsAndTheDeviceStatsFields(String transport) {
    try (Channels.Connection connection = Channels.open(target(transport))) {
      ReflectionGrpcurl grpcurl = new ReflectionGrpcurl(connection.channel());
      ServiceDescriptor admin = grpcurl.service("gpumemd.v1.Admin");
      List<String> rpcs = admin.getMethods().stream().map(MethodDescriptor::getName).toList();
      assertTrue(rpcs.containsAll(List.of("ListDevices", "GetStats", "ListLeases", "ListSessions", "Trim",
          "SetRetentionCap")), "Admin rpcs: " + rpcs);
      MethodDescriptor getStats = admin.findMethodByName("GetStats");
      assertEquals("gpumemd.v1.GetStatsRequest", getStats.getInputType().getFullName());
      assertEquals("gpumemd.v1.GetStatsResponse", getStats.getOutputType().getFullName());
      Descriptor stats = getStats.getOutputType().findFieldByName("devices").getMessageType();
      assertEquals("gpumemd.v1.DeviceStats", stats.getFullName());
      List<String> fields = stats.getFields().stream().map(FieldDescriptor::getName).toList();
      assertTrue(fields.containsAll(List.of("hits", "misses", "returns", "evictions", "alloc_retries", "ooms",
          "leased_bytes", "cached_bytes", "reserved_bytes", "peak_leased_bytes", "active_leases", "cached_blocks",
          "segments", "retention_cap_bytes", "capacity_bytes")), "DeviceStats fields: " + fields);
    }
  }

  /**
   * {@code grpcurl describe} shows the .proto comments: the daemon serves reflection from a
   * descriptor set built with source info (DocumentedSchema), not from the generated classes,
   * whose descriptors have it stripped. The comments themselves are held to the contract
   * (every rpc and DeviceStats field has one) in the .proto source.
   */
  @Test
  void reflectedDescriptors_carryTheProtoComments() {
    try (Channels.Connection connection = Channels.open(target("tcp"))) {
      FileDescriptorProto file = new ReflectionGrpcurl(connection.channel()).rawFileContaining("gpumemd.v1.Admin");
      assertEquals("gpumemd/v1/gpumemd.proto", file.getName());
      assertTrue(file.hasSourceCodeInfo(), "reflection serves no source info: describe would show no comments");
      List<String> comments = file.getSourceCodeInfo().getLocationList().stream()
          .map(l -> l.getLeadingComments().trim()).toList();
      assertTrue(comments.contains("Returns the pool counters and gauges of one device, or of every device."), comments.toString());
      assertTrue(comments.contains("Leases served from cached memory."), comments.toString());
    }
    String proto = RepoFiles.read("proto/src/main/proto/gpumemd/v1/gpumemd.proto");
    List<String> lines = proto.lines().map(String::trim).toList();
    List<String> uncommented = new ArrayList<>();
    String message = "";
    for (int i = 0; i < lines.size(); i++) {
      String line = lines.get(i);
      if (line.startsWith("message ")) {
        message = line.split("\\s+")[1];
      }
      boolean rpc = line.startsWith("rpc ");
      boolean statsField = message.equals("DeviceStats") && line.matches("int(32|64) \\w+ = \\d+;");
      if ((rpc || statsField) && (i == 0 || !lines.get(i - 1).startsWith("//"))) {
        uncommented.add(line);
      }
    }
    assertEquals(List.of(), uncommented, "rpcs and DeviceStats fields without a // comment in gpumemd.proto");
  }

  @ParameterizedTest
  @ValueSource(strings = {"tcp", "unix"})
  void getStatsAsJson_reportsEveryDevicesCounters(String transport) {
    try (Channels.Connection connection = Channels.open(target(transport))) {
      String json = new ReflectionGrpcurl(connection.channel()).call("gpumemd.v1.Admin/GetStats", "{}");
      JsonArray devices = JsonParser.parseString(json).getAsJsonObject().getAsJsonArray("devices");
      assertEquals(2, devices.size(), "one entry per device of the test daemon: " + json);
      JsonObject device0 = devices.get(0).getAsJsonObject();
      // protobuf JSON: lowerCamelCase names, int64 as strings, zero fields left out
      assertEquals("1", device0.get("hits").getAsString(), json);
      assertEquals("1", device0.get("misses").getAsString(), json);
      assertEquals("2", device0.get("returns").getAsString(), json);
      assertEquals(Long.toString(256 * MIB), device0.get("capacityBytes").getAsString(), json);
      assertTrue(device0.has("cachedBytes") && device0.has("reservedBytes") && device0.has("retentionCapBytes"), json);
      assertEquals(1, devices.get(1).getAsJsonObject().get("device").getAsInt(), json);

      String one = new ReflectionGrpcurl(connection.channel()).call("gpumemd.v1.Admin/GetStats", "{\"device\": 1}");
      JsonArray only = JsonParser.parseString(one).getAsJsonObject().getAsJsonArray("devices");
      assertEquals(1, only.size(), one);
    }
  }

  @ParameterizedTest
  @ValueSource(strings = {"tcp", "unix"})
  void everyReadmeGrpcurlExample_runs(String transport) {
    ServerConfig image = new GpumemdImage().config(List.of());
    // The root README addresses a daemon started with the defaults; deploy/README.md the image.
    String defaultSocket = io.gpumemd.server.config.ServerOptions.parse(new String[0], java.util.Map.of())
        .listeners().socket().toString();
    assertTrue(RepoFiles.read("deploy/README.md").contains("--listen 127.0.0.1:50051")
        && RepoFiles.read("README.md").contains("--listen 127.0.0.1:50051"), "the READMEs say how TCP is turned on");
    List<List<String>> examples = readmeGrpcurlCommands("deploy/README.md");
    assertTrue(examples.size() >= 10, "README grpcurl examples: " + examples.size());
    List<List<String>> rootExamples = readmeGrpcurlCommands("README.md");
    assertTrue(rootExamples.size() >= 3, "root README grpcurl examples: " + rootExamples.size());
    examples.addAll(rootExamples);
    // Token examples need a daemon with the README's tokens file: tokenExample_actsAsTheTokensTenant.
    examples.removeIf(words -> words.contains("-H"));
    try (Channels.Connection connection = Channels.open(target(transport))) {
      ReflectionGrpcurl grpcurl = new ReflectionGrpcurl(connection.channel());
      for (List<String> words : examples) {
        String address = address(words);
        if (words.contains("-unix")) {
          String expected = rootExamples.contains(words) ? defaultSocket : image.listeners().socket().toString();
          assertEquals(expected, address, "README's socket: " + words);
        } else {
          // the images have no TCP listener: both READMEs show TCP for a daemon started with
          // --listen 127.0.0.1:50051, and say so
          assertEquals("127.0.0.1:50051", address, "README's TCP address: " + words);
        }
        String output = grpcurl.run(words);
        assertFalse(output.isBlank(), "no output from " + words);
        if (words.contains("grpc.health.v1.Health/Check")) {
          assertEquals("SERVING", JsonParser.parseString(output).getAsJsonObject().get("status").getAsString());
        }
      }
    }
  }

  /**
   * The README's grpcurl line with a bearer token, against a daemon whose --tokens-file is the
   * README's example file: it lists team A's session only, never root's, and names the tenant.
   */
  @Test
  void tokenExample_actsAsTheTokensTenant() throws Exception {
    List<List<String>> withToken = readmeGrpcurlCommands("README.md").stream().filter(w -> w.contains("-H")).toList();
    assertEquals(1, withToken.size(), "the README's grpcurl example with a token");
    String readme = RepoFiles.read("README.md");
    Matcher block = Pattern.compile("(?s)```text\n(  # TOKEN.*?)```").matcher(readme);
    assertTrue(block.find(), "the README's tokens file example");
    java.nio.file.Path tokens = java.nio.file.Files.createTempFile("gpumemd-tokens-", "");
    java.nio.file.Files.writeString(tokens, block.group(1).replaceAll("(?m)^  ", ""));
    java.nio.file.Files.setPosixFilePermissions(tokens, java.nio.file.attribute.PosixFilePermissions.fromString("rw-------"));
    String header = withToken.get(0).get(withToken.get(0).indexOf("-H") + 1);
    String token = header.substring(header.indexOf("Bearer ") + "Bearer ".length()).trim();
    try (TestDaemon tokenDaemon = TestDaemon.start("--tokens-file", tokens.toString());
         GpuMemClient root = GpuMemClient.builder(tokenDaemon.unixTarget()).clientName("root-worker").connect();
         GpuMemClient teamA = GpuMemClient.builder(tokenDaemon.tcpTarget()).bearerToken(token)
             .clientName("team-a-worker").connect();
         Channels.Connection connection = Channels.open(tokenDaemon.tcpTarget())) {
      String json = new ReflectionGrpcurl(connection.channel()).run(withToken.get(0));
      JsonArray sessions = JsonParser.parseString(json).getAsJsonObject().getAsJsonArray("sessions");
      assertEquals(1, sessions.size(), json);
      JsonObject session = sessions.get(0).getAsJsonObject();
      assertEquals(teamA.sessionId(), session.get("sessionId").getAsString(), json);
      assertEquals("token:team-a", session.get("tenant").getAsString(), json);
      assertFalse(json.contains(root.sessionId()), json);
    } finally {
      java.nio.file.Files.deleteIfExists(tokens);
    }
  }

  /** Outputs shown in deploy/README.md ({@code $ grpcurl ...} then lines) are what the daemon answers. */
  @Test
  void readmeShownOutputs_areTheDaemonsAnswers() {
    List<String> lines = RepoFiles.read("deploy/README.md").lines().toList();
    int checked = 0;
    try (Channels.Connection connection = Channels.open(target("tcp"))) {
      ReflectionGrpcurl grpcurl = new ReflectionGrpcurl(connection.channel());
      for (int i = 0; i < lines.size(); i++) {
        if (!lines.get(i).startsWith("$ grpcurl ")) {
          continue;
        }
        List<String> shown = new ArrayList<>();
        for (int j = i + 1; j < lines.size() && !lines.get(j).isBlank() && !lines.get(j).startsWith("```"); j++) {
          shown.add(lines.get(j));
        }
        List<String> answered = new ArrayList<>(grpcurl.run(shellWords(lines.get(i).substring(2))).lines().toList());
        java.util.Collections.sort(answered); // grpcurl sorts what it lists
        assertEquals(shown, answered, lines.get(i));
        checked++;
      }
    }
    assertTrue(checked >= 2, "shown outputs checked: " + checked);
  }

  @Test
  void readmeMetricTable_listsExactlyTheMetricsServed() throws Exception {
    HttpResponse<String> response = HttpClient.newHttpClient().send(HttpRequest.newBuilder(
        URI.create("http://127.0.0.1:" + daemon.server().metricsPort() + "/metrics")).build(),
        HttpResponse.BodyHandlers.ofString());
    assertEquals(200, response.statusCode());
    Set<String> served = new TreeSet<>();
    Matcher type = Pattern.compile("(?m)^# TYPE (\\S+) (\\S+)$").matcher(response.body());
    while (type.find()) {
      served.add(type.group(1) + " " + type.group(2));
    }
    Set<String> documented = new TreeSet<>();
    Matcher row = Pattern.compile("(?m)^\\| `(gpumemd_\\w+)` \\| (\\w+) \\|").matcher(RepoFiles.read("deploy/README.md"));
    while (row.find()) {
      documented.add(row.group(1) + " " + row.group(2));
    }
    assertEquals(served, documented, "deploy/README.md's metric table (name type) vs /metrics");
  }

  // --- helpers ----------------------------------------------------------------------------

  private static String target(String transport) {
    return transport.equals("unix") ? daemon.unixTarget() : daemon.tcpTarget();
  }

  /** The grpcurl lines of the README's sh blocks, split as a shell would. */
  private static List<List<String>> readmeGrpcurlCommands(String file) {
    List<List<String>> out = new ArrayList<>();
    boolean inShell = false;
    for (String line : RepoFiles.read(file).lines().toList()) {
      if (line.startsWith("```")) {
        inShell = !inShell && line.equals("```sh");
        continue;
      }
      if (inShell && line.startsWith("grpcurl ")) {
        out.add(shellWords(line));
      }
    }
    return out;
  }

  /** The first positional argument: grpcurl's address. */
  private static String address(List<String> words) {
    for (int i = 1; i < words.size(); i++) {
      if (words.get(i).equals("-d") || words.get(i).equals("-H")) {
        i++;
      } else if (!words.get(i).startsWith("-")) {
        return words.get(i);
      }
    }
    throw new AssertionError("no address in " + words);
  }

  /** Splits on blanks, honouring single and double quotes (no escapes, no expansions). */
  static List<String> shellWords(String line) {
    List<String> words = new ArrayList<>();
    StringBuilder word = new StringBuilder();
    boolean inWord = false;
    char quote = 0;
    for (char c : line.toCharArray()) {
      if (quote != 0) {
        if (c == quote) {
          quote = 0;
        } else {
          word.append(c);
        }
      } else if (c == '\'' || c == '"') {
        quote = c;
        inWord = true;
      } else if (Character.isWhitespace(c)) {
        if (inWord) {
          words.add(word.toString());
          word.setLength(0);
          inWord = false;
        }
      } else {
        word.append(c);
        inWord = true;
      }
    }
    if (quote != 0) {
      throw new AssertionError("unbalanced quote in: " + line);
    }
    if (inWord) {
      words.add(word.toString());
    }
    return words;
  }

  private static int freePort() throws IOException {
    try (ServerSocket socket = new ServerSocket(0)) {
      return socket.getLocalPort();
    }
  }
}
