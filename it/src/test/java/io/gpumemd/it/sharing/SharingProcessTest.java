package io.gpumemd.it.sharing;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.util.JsonFormat;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.gpumemd.client.Share;
import io.gpumemd.ctl.GpuMemCtl;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.ListObjectsResponse;
import io.gpumemd.proto.v1.ObjectInfo;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.TestChannel;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import java.util.function.ToLongFunction;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Sharing end to end with real client processes ({@link SharingClientMain}) against a daemon
 * whose pools the test inspects: a producer that shares and exits before its consumer attaches,
 * a consumer SIGKILLed while attached, 16 consumers of one published object released and killed
 * in random order, read-only holds mapped read-only in a child process, and a published object
 * that outlives its publisher until {@code gpumemctl objects rm} removes it. Figures come from
 * {@code Admin.GetStats} as an operator sees them; after each test the daemon's pools must be
 * empty and consistent.
 */
class SharingProcessTest {
  private static final long GRACE_MS = 500;
  private static final long MiB = 1 << 20;

  private TestDaemon daemon;
  private TestChannel channel;
  private AdminGrpc.AdminBlockingStub admin;
  private final List<HolderProcess> holders = new ArrayList<>();
  private final List<GpuMemClient> clients = new ArrayList<>();

  @BeforeEach
  void start() {
    daemon = TestDaemon.start("--keepalive-grace-ms", Long.toString(GRACE_MS));
    channel = new TestChannel(daemon.unixTarget());
    admin = AdminGrpc.newBlockingStub(channel.channel());
  }

  @AfterEach
  void stop() {
    try {
      holders.forEach(HolderProcess::close);
      clients.forEach(GpuMemClient::close);
      awaitStat(DeviceStats::getLiveHolds, 0, 5_000, "no hold left");
      awaitStat(DeviceStats::getLeasedBytes, 0, 5_000, "nothing leased after the test");
      assertEquals(0, stat(DeviceStats::getPublishedObjects), "published objects left");
      daemon.verifyInvariants();
    } finally {
      channel.close();
      daemon.close();
    }
  }

  private GpuMemClient client(String name) {
    GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientName(name).connect();
    clients.add(client);
    return client;
  }

  private HolderProcess holder(String mode, String key, int seed) throws Exception {
    HolderProcess holder = HolderProcess.start(mode, daemon.unixTarget(), key, seed);
    holders.add(holder);
    return holder;
  }

  private long stat(ToLongFunction<DeviceStats> figure) {
    return figure.applyAsLong(admin.withDeadlineAfter(10, TimeUnit.SECONDS)
        .getStats(GetStatsRequest.newBuilder().setDevice(0).build()).getDevices(0));
  }

  /** Waits (bounded) until a device-0 figure has a value; fails with the last one seen. */
  private void awaitStat(ToLongFunction<DeviceStats> figure, long expected, long millis, String what) {
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
    long value;
    while ((value = stat(figure)) != expected) {
      if (System.nanoTime() > deadline) {
        throw new AssertionError(what + ": " + value + " after " + millis + " ms, expected " + expected);
      }
      sleep(10);
    }
  }

  private void awaitNoSessions(String what) {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (daemon.server().registry().sessionCount() != clients.size()) {
      if (System.nanoTime() > deadline) {
        throw new AssertionError(what + ": " + daemon.server().registry().sessionCount() + " sessions");
      }
      sleep(10);
    }
  }

  private static void sleep(long millis) {
    try {
      Thread.sleep(millis);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new AssertionError(e);
    }
  }

  // ---------------------------------------------------------------------------- tokens

  @Test
  void producerSharesAndExits_consumerAttachesAfterItIsGone_memoryReturnsOnlyWhenTheConsumerReleases()
      throws Exception {
    Map<String, String> produced = HolderProcess.produce("share", daemon.unixTarget(), Long.toString(MiB), "5", "1");
    long block = Long.parseLong(produced.get("block"));
    awaitNoSessions("the producer's session ended with its process");
    assertEquals(block, stat(DeviceStats::getLeasedBytes), "the token holds the block after its producer is gone");
    assertEquals(1, stat(DeviceStats::getShares));
    assertEquals(1, daemon.server().registry().sharing().tokenCount());

    HolderProcess consumer = holder("attach", produced.get("token"), 5);
    Map<String, String> ready = consumer.await("READY");
    assertEquals("true", ready.get("intact"), "the consumer reads the producer's pattern: " + consumer.output());
    assertEquals("true", ready.get("attached"));
    assertEquals(produced.get("segment"), ready.get("segment"), "the same segment");
    assertEquals(produced.get("offset"), ready.get("offset"), "the same offset");
    assertEquals(0, daemon.server().registry().sharing().tokenCount(), "the one-shot token is used up");
    assertEquals(1, stat(DeviceStats::getLiveHolds));
    assertEquals(block, stat(DeviceStats::getLeasedBytes), "the hold keeps the block leased");

    GpuMemException again = assertThrows(GpuMemException.class,
        () -> client("late").attach(produced.get("token")));
    assertEquals(Status.Code.NOT_FOUND, again.code(), "a one-shot token serves one attach");

    assertEquals("true", consumer.ask("check", "CHECK").get("intact"));
    assertEquals(block, stat(DeviceStats::getLeasedBytes), "still leased while the consumer holds it");
    consumer.ask("release", "RELEASED");
    awaitStat(DeviceStats::getLeasedBytes, 0, 5_000, "the block returns when the consumer releases");
    assertEquals(0, stat(DeviceStats::getLiveHolds));
    consumer.exit();
    daemon.verifyInvariants();
  }

  @Test
  void consumerSigkilledWhileAttached_holdDroppedWithinGrace_blockFreedWhenTheOwnerReleases() throws Exception {
    GpuMemClient owner = client("owner");
    Lease lease = owner.lease(0, 512 * 1024, false, "shared");
    SharingClientMain.fill(lease.buffer(), 9);
    Share share = lease.share();
    HolderProcess consumer = holder("attach", share.token(), 9);
    assertEquals("true", consumer.await("READY").get("intact"));
    assertEquals(1, stat(DeviceStats::getLiveHolds));

    consumer.kill();
    awaitStat(DeviceStats::getLiveHolds, 0, GRACE_MS + 1000, "the killed consumer's hold is dropped within grace + 1 s");
    assertEquals(lease.blockBytes(), stat(DeviceStats::getLeasedBytes), "the owner's lease and the token remain");
    assertTrue(SharingClientMain.intact(lease.buffer(), 9), "the owner's bytes are untouched");

    share.close();
    assertEquals(lease.blockBytes(), stat(DeviceStats::getLeasedBytes), "the owner's lease holds the block");
    lease.close();
    awaitStat(DeviceStats::getLeasedBytes, 0, 5_000, "the block is freed when the owner releases");
    daemon.verifyInvariants();
  }

  // ---------------------------------------------------------------------------- named objects

  @Test
  void sixteenConsumersOfOnePublishedObject_releasedAndKilledInRandomOrder_poolBalancesToZero() throws Exception {
    Map<String, String> produced = HolderProcess.produce("publish", daemon.unixTarget(), Long.toString(MiB), "21",
        "weights/layer-0", "false");
    long block = Long.parseLong(produced.get("block"));
    awaitNoSessions("the publisher's session ended with its process");
    long frees = stat(DeviceStats::getBackendFrees);
    long segments = stat(DeviceStats::getSegments);

    List<HolderProcess> consumers = new ArrayList<>();
    for (int i = 0; i < 16; i++) {
      consumers.add(holder("lookup", "weights/layer-0", 21));
    }
    for (HolderProcess consumer : consumers) {
      Map<String, String> ready = consumer.await("READY");
      assertEquals("true", ready.get("intact"), consumer.output());
      assertEquals(produced.get("segment"), ready.get("segment"));
    }
    assertEquals(16, stat(DeviceStats::getLiveHolds));
    assertEquals(block, stat(DeviceStats::getLeasedBytes), "sixteen holds, one block counted once");

    // An adversary leases and overwrites blocks of the same size after each step: a block
    // returned early would be handed to it, and the survivors would see its bytes.
    GpuMemClient adversary = GpuMemClient.builder(daemon.unixTarget()).clientName("adversary").clientCacheBytes(0)
        .connect();
    clients.add(adversary);
    Random random = new Random(16);
    List<HolderProcess> order = new ArrayList<>(consumers);
    Collections.shuffle(order, random);
    List<HolderProcess> alive = new ArrayList<>(consumers);
    int killed = 0;
    for (HolderProcess consumer : order) {
      switch (random.nextInt(3)) {
        case 0 -> { // release, then exit cleanly
          consumer.ask("release", "RELEASED");
          consumer.exit();
        }
        case 1 -> { // crash while attached
          consumer.kill();
          killed++;
        }
        default -> consumer.exit(); // exit while attached: closing the client ends the hold
      }
      alive.remove(consumer);
      awaitStat(DeviceStats::getLiveHolds, alive.size(), GRACE_MS + 1000,
          "holds after a consumer ended (" + (16 - alive.size()) + " of 16 gone)");
      for (int i = 0; i < 2; i++) {
        try (Lease other = adversary.lease(0, MiB, false, "adversary")) {
          SharingClientMain.fill(other.buffer(), 99);
        }
      }
      for (HolderProcess survivor : alive) {
        assertEquals("true", survivor.ask("check", "CHECK").get("intact"),
            "the pattern is intact in a survivor until it releases:\n" + survivor.output());
      }
      awaitStat(DeviceStats::getLeasedBytes, block, 5_000, "the object's block stays leased, once");
      assertEquals(frees, stat(DeviceStats::getBackendFrees), "no segment freed while the object is held");
      assertTrue(stat(DeviceStats::getSegments) >= segments, "no segment freed while the object is held");
      daemon.verifyInvariants();
    }
    assertTrue(killed > 0 && killed < 16, "the random plan mixes kills and releases: " + killed + " killed");
    assertEquals(0, stat(DeviceStats::getLiveHolds));
    assertEquals(block, stat(DeviceStats::getLeasedBytes), "the name alone holds the block");
    assertEquals(1, stat(DeviceStats::getPublishedObjects));

    assertTrue(client("janitor").unpublish("weights/layer-0"), "the name was the last hold");
    assertEquals(0, stat(DeviceStats::getLeasedBytes), "the pool balances to zero");
    assertEquals(0, stat(DeviceStats::getPublishedBytes));
    assertEquals(0, stat(DeviceStats::getSharedBlocks));
    daemon.verifyInvariants();
  }

  @Test
  void readOnlyHolds_areMappedReadOnlyInTheChild_writableOnesWriteThrough() throws Exception {
    HolderProcess.produce("publish", daemon.unixTarget(), Long.toString(256 * 1024), "33", "ro-object", "true");
    HolderProcess.produce("publish", daemon.unixTarget(), Long.toString(256 * 1024), "34", "rw-object", "false");
    HolderProcess ro = holder("lookup", "ro-object", 33);
    HolderProcess rw = holder("lookup", "rw-object", 34);
    Map<String, String> roReady = ro.await("READY");
    assertEquals("true", roReady.get("ro"));
    assertEquals("ReadOnlyBufferException", roReady.get("writeFails"), "a write to a read-only hold throws");
    assertEquals("true", roReady.get("intact"), "and the bytes stay as published");
    Map<String, String> rwReady = rw.await("READY");
    assertEquals("false", rwReady.get("ro"));
    rw.ask("write 77", "WROTE");

    GpuMemClient reader = client("reader");
    try (Lease view = reader.lookup("rw-object")) {
      assertTrue(SharingClientMain.intact(view.buffer(), 77), "the child's write reached the shared block");
    }
    // A read-only share token, attached in a child process, maps read-only too.
    Lease lease = reader.lease(0, 64 * 1024, false, "ro-token");
    SharingClientMain.fill(lease.buffer(), 35);
    try (Share share = lease.share(java.time.Duration.ofSeconds(30), true, 0)) {
      HolderProcess token = holder("attach", share.token(), 35);
      Map<String, String> ready = token.await("READY");
      assertEquals("true", ready.get("ro"));
      assertEquals("ReadOnlyBufferException", ready.get("writeFails"));
      assertEquals("true", ready.get("intact"));
      token.exit();
    }
    lease.close();
    ro.exit();
    rw.exit();
    assertTrue(reader.unpublish("ro-object"));
    assertTrue(reader.unpublish("rw-object"));
  }

  @Test
  void publisherExits_objectSurvives_gpumemctlListsItWithItsHolders_andRemoveObjectFreesIt() throws Exception {
    Map<String, String> shard3 = HolderProcess.produce("publish", daemon.unixTarget(), Long.toString(2 * MiB), "50",
        "model/shard-3", "true");
    Map<String, String> shard4 = HolderProcess.produce("publish", daemon.unixTarget(), Long.toString(MiB), "51",
        "model/shard-4", "false");
    long blocks = Long.parseLong(shard3.get("block")) + Long.parseLong(shard4.get("block"));
    awaitNoSessions("the publishers' sessions ended with their processes");
    assertEquals(blocks, stat(DeviceStats::getLeasedBytes), "both objects outlive their publishers");
    assertEquals(2, stat(DeviceStats::getPublishedObjects));

    HolderProcess worker = holder("lookup", "model/shard-3", 50);
    assertEquals("true", worker.await("READY").get("intact"));

    String table = gpumemctl(0, "objects");
    List<String> lines = table.lines().toList();
    assertEquals(3, lines.size(), table);
    assertTrue(lines.get(1).matches("model/shard-3\\s+uid:0\\s+0\\s+2\\.0 MiB\\s+2\\s+1\\s+.*\\s+yes\\s+no"), table);
    assertTrue(lines.get(2).matches("model/shard-4\\s+uid:0\\s+0\\s+1\\.0 MiB\\s+1\\s+0\\s+.*\\s+no\\s+no"), table);
    ListObjectsResponse.Builder json = ListObjectsResponse.newBuilder();
    JsonFormat.parser().merge(gpumemctl(0, "--json", "objects"), json);
    ObjectInfo listed = json.getObjects(0);
    assertEquals("model/shard-3", listed.getName());
    assertEquals(1, listed.getHolders(), "the worker holds it");
    assertEquals(2, listed.getHolds(), "the name and the worker's hold");
    assertEquals(1, listed.getLookups());
    assertTrue(listed.getPublishedBy().contains("producer-"), listed.getPublishedBy());

    assertEquals("removed object 'model/shard-4'; its block went back to the pool\n",
        gpumemctl(0, "objects", "rm", "model/shard-4"));
    assertEquals(Long.parseLong(shard3.get("block")), stat(DeviceStats::getLeasedBytes));
    assertEquals("removed object 'model/shard-3'; its block stays leased until its other holders release it\n",
        gpumemctl(0, "objects", "rm", "model/shard-3"));
    assertTrue(gpumemctl(1, "objects", "rm", "model/shard-3").startsWith("gpumemctl: NOT_FOUND: "));
    assertEquals("no published objects\n", gpumemctl(0, "objects"));
    GpuMemException gone = assertThrows(GpuMemException.class, () -> client("late").lookup("model/shard-3"));
    assertEquals(Status.Code.NOT_FOUND, gone.code());
    assertEquals("true", worker.ask("check", "CHECK").get("intact"), "the worker's hold outlives the name");
    assertEquals(Long.parseLong(shard3.get("block")), stat(DeviceStats::getLeasedBytes));
    worker.ask("release", "RELEASED");
    awaitStat(DeviceStats::getLeasedBytes, 0, 5_000, "the block returns with the worker's hold");
    worker.exit();
  }

  @Test
  void parkedObject_freesItsDeviceMemory_andANewProcessLooksItUpWithItsBytes() throws Exception {
    Map<String, String> weights = HolderProcess.produce("publish", daemon.unixTarget(), Long.toString(2 * MiB), "61",
        "model/parked", "true");
    long block = Long.parseLong(weights.get("block"));
    awaitNoSessions("the publisher's session ended with its process");
    assertEquals(block, stat(DeviceStats::getLeasedBytes));

    assertEquals("parked object 'model/parked': 2.0 MiB in host memory, 2.0 MiB of device memory freed\n",
        gpumemctl(0, "objects", "park", "model/parked"));
    assertEquals(0, stat(DeviceStats::getLeasedBytes), "its device memory went back");
    assertEquals(block, daemon.server().registry().sleep().store().heldBytes());
    assertTrue(gpumemctl(0, "objects").lines().anyMatch(l -> l.startsWith("model/parked") && l.endsWith(
        "2.0 MiB in host memory")));

    HolderProcess engine = holder("lookup", "model/parked", 61);
    Map<String, String> ready = engine.await("READY");

    assertEquals("true", ready.get("intact"), "the new process reads the published bytes: " + engine.output());
    assertEquals(block, stat(DeviceStats::getLeasedBytes), "restored into a new block");
    assertEquals(0, daemon.server().registry().sleep().store().heldBytes(), "its host copy dropped");
    engine.ask("release", "RELEASED");
    engine.exit();
    assertTrue(client("janitor").unpublish("model/parked"), "the name was the last hold");
  }

  /** Runs gpumemctl as a real process against the daemon; its output (stderr merged), checked for the exit code. */
  private String gpumemctl(int expectedExit, String... args) throws Exception {
    List<String> command = DaemonProcess.javaCommand(GpuMemCtl.class.getName());
    command.addAll(List.of("--target", daemon.unixTarget()));
    command.addAll(List.of(args));
    Process p = new ProcessBuilder(command).redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertTrue(p.waitFor(60, TimeUnit.SECONDS), "gpumemctl did not end:\n" + out);
    assertEquals(expectedExit, p.exitValue(), "gpumemctl " + String.join(" ", args) + ":\n" + out);
    return out;
  }
}
