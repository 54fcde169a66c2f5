package io.gpumemd.ctl;

import io.gpumemd.common.Sizes;
import io.gpumemd.proto.v1.SleepResponse;
import io.gpumemd.proto.v1.SleepSessionRequest;
import io.gpumemd.proto.v1.WakeResponse;
import io.gpumemd.proto.v1.WakeSessionRequest;
import java.util.ArrayList;
import java.util.List;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;
import picocli.CommandLine.Parameters;

/**
 * An admin's sleep and wake of a session ({@code Admin.SleepSession}, {@code WakeSession}): the
 * daemon asks the session's client, which pauses its application (its registered sleep
 * handler), sleeps or wakes, and the command prints what the client's call did. Each an {@link
 * AdminCommand}. Not thread-safe (one command per instance).
 */
final class SleepCommands {
  private SleepCommands() {}

  @Command(name = "sleep", description = "put a session to sleep through its client (which must have registered "
      + "a sleep handler): its device memory freed, its leases kept at their addresses")
  static final class Sleep extends AdminCommand {
    @Parameters(index = "0", paramLabel = "SESSION", description = "the session id (gpumemctl sessions)")
    String session;
    @Option(names = "--level", paramLabel = "1|2", defaultValue = "1",
        description = "1: contents kept in the daemon's host memory (default); 2: dropped, the wake gives zeros")
    int level;
    @Option(names = "--tags", paramLabel = "TAG", split = ",",
        description = "only the segments holding a lease with one of these tags (default: every lease)")
    List<String> tags = new ArrayList<>();

    Sleep(GpuMemCtl ctl) {
      super(ctl);
    }

    @Override
    int run(AdminConnection admin) {
      SleepResponse response = admin.admin().sleepSession(SleepSessionRequest.newBuilder().setSessionId(session)
          .setLevel(level).addAllTags(tags).build());
      return admin.print(response, out -> out.println("session " + session + " sleeps at level " + level + ": "
          + response.getLeaseIdsCount() + " leases in " + response.getSegmentIdsCount() + " segments, "
          + Sizes.format(response.getFreedBytes()) + " of device memory freed, " + Sizes.format(response.getHostBytes())
          + " in host memory"));
    }
  }

  @Command(name = "wake", description = "wake a sleeping session through its client: every lease mapped again at "
      + "its address, then the client's work resumes")
  static final class Wake extends AdminCommand {
    @Parameters(index = "0", paramLabel = "SESSION", description = "the session id (gpumemctl sessions)")
    String session;

    Wake(GpuMemCtl ctl) {
      super(ctl);
    }

    @Override
    int run(AdminConnection admin) {
      WakeResponse response = admin.admin().wakeSession(WakeSessionRequest.newBuilder().setSessionId(session)
          .build());
      int leases = response.getSegmentsList().stream().mapToInt(w -> w.getLeaseIdsCount()).sum();
      long bytes = response.getSegmentsList().stream().mapToLong(w -> w.getHandle().getSegmentBytes()).sum();
      return admin.print(response, out -> out.println("session " + session + " is awake: " + leases + " leases in "
          + response.getSegmentsCount() + " segments, " + Sizes.format(bytes) + " of device memory"));
    }
  }
}
