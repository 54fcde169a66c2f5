package io.gpumemd.it.grpc;

import io.gpumemd.server.pool.PoolMetric;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import io.gpumemd.client.Channels;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.CloseSessionRequest;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.ReleaseRequest;
import io.gpumemd.proto.v1.SetRetentionCapRequest;
import io.gpumemd.proto.v1.TrimRequest;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.books.SecureIds;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.util.ArrayList;
import java.util.EnumMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

/**
 * Hundreds of randomly corrupted requests (sizes, ids, devices, strings, handles) against a
 * live daemon: every one is answered with a deliberate status (never INTERNAL or UNKNOWN), and
 * the pools' invariants hold afterwards. The seed is fixed, so a failure reproduces.
 */
class MalformedInputTest {
  private static final int REQUESTS = 800;

  private final SplittableRandom random = new SplittableRandom(20261122);
  private final List<String> sessions = new ArrayList<>();
  private final List<String> leases = new ArrayList<>();

  private long size() {
    return switch (random.nextInt(8)) {
      case 0 -> 0;
      case 1 -> -random.nextLong(1, Long.MAX_VALUE);
      case 2 -> Long.MAX_VALUE - random.nextInt(1000);
      case 3 -> Long.MIN_VALUE;
      case 4 -> random.nextLong(1L << 28, 1L << 40); // beyond the 256 MiB devices
      case 5 -> random.nextLong(200L << 20, 257L << 20); // around the budget
      default -> random.nextLong(1, 4L << 20);
    };
  }

  private String id(List<String> known) {
    return switch (random.nextInt(7)) {
      case 0 -> "";
      case 1 -> SecureIds.next(); // well formed, unknown
      case 2 -> text(random.nextInt(1, 80));
      case 3 -> SecureIds.next().toUpperCase();
      case 4 -> SecureIds.next().substring(1);
      default -> known.isEmpty() ? SecureIds.next() : known.get(random.nextInt(known.size()));
    };
  }

  private String text(int length) {
    StringBuilder s = new StringBuilder();
    for (int i = 0; i < length; i++) {
      s.appendCodePoint(switch (random.nextInt(4)) {
        case 0 -> random.nextInt(0, 32); // control characters
        case 1 -> random.nextInt(0x80, 0x2fff); // beyond ASCII
        default -> random.nextInt(32, 127);
      });
    }
    return s.toString();
  }

  private String label() {
    return text(random.nextInt(4) == 0 ? random.nextInt(100, 400) : random.nextInt(0, 20));
  }

  private int device() {
    return random.nextInt(5) == 0 ? random.nextInt() : random.nextInt(-1, 4);
  }

  @Test
  void corruptedRequests_getDeliberateStatuses_andLeaveThePoolsConsistent() {
    Map<Status.Code, Integer> seen = new EnumMap<>(Status.Code.class);
    try (TestDaemon daemon = TestDaemon.start();
         Channels.Connection connection = Channels.open(daemon.unixTarget())) {
      AllocatorGrpc.AllocatorBlockingStub allocator = AllocatorGrpc.newBlockingStub(connection.channel());
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(connection.channel());
      for (int i = 0; i < REQUESTS; i++) {
        int rpc = random.nextInt(9);
        Status.Code code;
        try {
          switch (rpc) {
            case 0 -> sessions.add(allocator.openSession(OpenSessionRequest.newBuilder()
                .setClientName(label()).setTtlSeconds(random.nextInt()).build()).getSessionId());
            case 1, 2, 3 -> leases.add(allocator.lease(LeaseRequest.newBuilder().setSessionId(id(sessions))
                .setDevice(device()).setSizeBytes(size()).setZero(random.nextBoolean()).setTag(label())
                .build()).getLeaseId());
            case 4, 5 -> {
              byte[] handle = new byte[random.nextInt(3) == 0 ? random.nextInt(0, 100) : 0];
              random.nextBytes(handle);
              allocator.release(ReleaseRequest.newBuilder().setSessionId(id(sessions)).setLeaseId(id(leases))
                  .setCudaIpcEventHandle(ByteString.copyFrom(handle)).build());
            }
            case 6 -> allocator.closeSession(CloseSessionRequest.newBuilder().setSessionId(id(sessions)).build());
            case 7 -> {
              GetStatsRequest.Builder stats = GetStatsRequest.newBuilder();
              if (random.nextBoolean()) {
                stats.setDevice(device());
              }
              admin.getStats(stats.build());
              admin.listLeases(ListLeasesRequest.newBuilder().setSessionId(random.nextBoolean() ? "" : id(sessions)).build());
            }
            default -> {
              if (random.nextBoolean()) {
                admin.trim(TrimRequest.newBuilder().setDevice(device()).setKeepBytes(size()).build());
              } else {
                admin.setRetentionCap(SetRetentionCapRequest.newBuilder().setDevice(device()).setCapBytes(size()).build());
              }
            }
          }
          code = Status.Code.OK;
        } catch (StatusRuntimeException e) {
          code = e.getStatus().getCode();
          assertTrue(code != Status.Code.INTERNAL && code != Status.Code.UNKNOWN,
              "request " + i + " (rpc " + rpc + ") answered " + e.getStatus());
          assertTrue(e.getStatus().getDescription() != null && !e.getStatus().getDescription().isBlank(),
              "a refusal says why: " + e.getStatus());
        }
        seen.merge(code, 1, Integer::sum);
      }
      daemon.verifyInvariants();
      assertTrue(seen.getOrDefault(Status.Code.OK, 0) > 50, "enough requests succeeded: " + seen);
      assertTrue(seen.getOrDefault(Status.Code.INVALID_ARGUMENT, 0) > 100, "enough were invalid: " + seen);
      assertTrue(seen.getOrDefault(Status.Code.NOT_FOUND, 0) > 20, "enough were unknown: " + seen);
      daemon.server().registry().endAll("test end");
      for (DevicePool pool : daemon.server().pools().all()) {
        pool.verifyInvariants();
        assertEquals(0, pool.stats().get(PoolMetric.LEASED_BYTES));
      }
    }
    System.out.println("malformed-input statuses: " + seen);
  }
}
