package io.gpumemd.ctl;

import io.gpumemd.common.Sizes;
import io.gpumemd.proto.v1.SetRetentionCapRequest;
import io.gpumemd.proto.v1.SetRetentionCapResponse;
import io.gpumemd.proto.v1.TrimRequest;
import io.gpumemd.proto.v1.TrimResponse;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

/**
 * The commands that change the pool's cache: {@link Trim} frees cached memory now and
 * {@link SetCap} sets how much may stay cached, on one device or all, each an
 * {@link AdminCommand}. Not thread-safe (one command per instance).
 */
final class PoolCommands {
  private PoolCommands() {}

  @Command(name = "trim", description = "free cached memory down to SIZE per device")
  static final class Trim extends AdminCommand {
    @Mixin
    DeviceFilter filter = new DeviceFilter();
    @Option(names = "--keep-bytes", paramLabel = "SIZE", required = true, converter = Converters.Size.class,
        description = "cached bytes to keep per device (0 frees every cached segment)")
    long keepBytes;

    Trim(GpuMemCtl ctl) {
      super(ctl);
    }

    @Override
    int run(AdminConnection admin) {
      TrimRequest.Builder request = TrimRequest.newBuilder().setKeepBytes(keepBytes);
      filter.applyTo(request::setDevice);
      TrimResponse response = admin.admin().trim(request.build());
      return admin.print(response, out -> out.println("freed " + Sizes.format(response.getFreedBytes()) + " ("
          + response.getFreedBytes() + " bytes) on " + filter.where() + ", keeping at most "
          + Sizes.format(request.getKeepBytes()) + " cached per device"));
    }
  }

  @Command(name = "set-cap", description = "set the retention cap (0 disables caching)")
  static final class SetCap extends AdminCommand {
    @Mixin
    DeviceFilter filter = new DeviceFilter();
    @Option(names = "--cap-bytes", paramLabel = "SIZE", required = true, converter = Converters.Size.class,
        description = "the most cached free memory to keep per device; lowering it evicts at once")
    long capBytes;

    SetCap(GpuMemCtl ctl) {
      super(ctl);
    }

    @Override
    int run(AdminConnection admin) {
      SetRetentionCapRequest.Builder request = SetRetentionCapRequest.newBuilder().setCapBytes(capBytes);
      filter.applyTo(request::setDevice);
      SetRetentionCapResponse response = admin.admin().setRetentionCap(request.build());
      return admin.print(response, out -> out.println("retention cap set to " + Sizes.format(request.getCapBytes())
          + " on " + filter.where() + ": evicted " + Sizes.format(response.getEvictedBytes()) + " ("
          + response.getEvictedBytes() + " bytes)"));
    }
  }
}
