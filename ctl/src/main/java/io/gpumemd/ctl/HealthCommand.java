package io.gpumemd.ctl;

import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/**
 * {@code gpumemctl health}: one grpc.health.v1 check of the whole server or of one service; the
 * exit code says whether it is SERVING (0) or not (1), for scripts and container health checks.
 * Not thread-safe (one command per instance).
 */
@Command(name = "health", description = "grpc.health.v1 check; exit 0 if SERVING, else 1")
final class HealthCommand extends AdminCommand {
  @Option(names = "--service", paramLabel = "NAME",
      description = "the service to check, e.g. gpumemd.v1.Allocator (default: the whole server)")
  String service = "";

  HealthCommand(GpuMemCtl ctl) {
    super(ctl);
  }

  @Override
  int run(AdminConnection admin) {
    HealthCheckResponse response = admin.health().check(HealthCheckRequest.newBuilder().setService(service).build());
    admin.print(response, out -> out.println(response.getStatus()));
    return response.getStatus() == HealthCheckResponse.ServingStatus.SERVING ? 0 : 1;
  }
}
