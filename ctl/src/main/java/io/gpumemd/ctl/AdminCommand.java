package io.gpumemd.ctl;

import java.util.concurrent.Callable;
import java.util.function.IntConsumer;
import picocli.CommandLine.Option;

/**
 * The base of the operator commands, one Admin (or health) call each: {@link #call} opens an
 * {@link AdminConnection}, has the command {@link #run} its call and print the answer, and closes
 * the connection. The commands are grouped by job: {@link ListingCommands} (devices, stats,
 * leases, sessions), {@link SharingCommands} (objects, objects rm, shares, revoke-share),
 * {@link PoolCommands} (trim, set-cap), {@link SleepCommands} (sleep, wake) and {@link HealthCommand}.
 *
 * <p>Each subclass is a picocli {@code @Command} that owns its options. Not thread-safe (one
 * command per instance).
 */
abstract class AdminCommand implements Callable<Integer> {
  private final GpuMemCtl ctl;

  AdminCommand(GpuMemCtl ctl) {
    this.ctl = ctl;
  }

  @Override
  public final Integer call() {
    try (AdminConnection admin = new AdminConnection(ctl)) {
      return run(admin);
    }
  }

  /** Makes the command's call on {@code admin} and prints the answer; returns the exit code. */
  abstract int run(AdminConnection admin);

  /** The option several admin commands share: the device filter. */
  static final class DeviceFilter {
    /** Any integer: whether the ordinal exists is the daemon's to say (INVALID_ARGUMENT). */
    @Option(names = "--device", paramLabel = "N", description = "only this device (default: all)")
    Integer device;

    /** Sets the request's device when one was named (a request without one means all). */
    void applyTo(IntConsumer setDevice) {
      if (device != null) {
        setDevice.accept(device);
      }
    }

    String where() {
      return device == null ? "all devices" : "device " + device;
    }
  }
}
