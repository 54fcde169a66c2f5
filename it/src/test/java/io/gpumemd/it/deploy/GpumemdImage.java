package io.gpumemd.it.deploy;

import io.gpumemd.server.config.ServerConfig;
import io.gpumemd.server.config.ServerOptions;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * What deploy/Dockerfile makes of the image, as the manifests and the compose file rely on it:
 * the daemon's entrypoint flags, volumes, ports and user.
 */
final class GpumemdImage {
  static final String DOCKERFILE = "deploy/Dockerfile";

  final ParsedDockerfile dockerfile = ParsedDockerfile.parse(RepoFiles.read(DOCKERFILE));
  final ParsedDockerfile.Stage runtime = dockerfile.finalStage();

  /** The entrypoint: {@code java [jvm flags] -jar JAR [daemon flags]}. */
  List<String> entrypoint() {
    return runtime.last("ENTRYPOINT").execForm();
  }

  /** The jar the entrypoint runs. */
  String daemonJar() {
    List<String> e = entrypoint();
    int jar = e.indexOf("-jar");
    if (jar < 0 || jar + 1 >= e.size()) {
      throw new AssertionError("ENTRYPOINT runs no -jar: " + e);
    }
    return e.get(jar + 1);
  }

  /** Where the image puts gpumemctl.jar: the runtime COPY whose destination is named so. */
  String ctlJar() {
    for (ParsedDockerfile.Instruction copy : runtime.all("COPY")) {
      String destination = copy.words().get(copy.words().size() - 1);
      if (destination.endsWith("/gpumemctl.jar")) {
        return destination;
      }
    }
    throw new AssertionError("the image copies no gpumemctl.jar");
  }

  /** The daemon flags baked into the entrypoint. */
  List<String> daemonFlags() {
    List<String> e = entrypoint();
    return List.copyOf(e.subList(e.indexOf("-jar") + 2, e.size()));
  }

  /**
   * The daemon's configuration in a container of this image run with {@code args} and {@code env},
   * as the daemon's own {@link ServerOptions} parses and validates it.
   */
  ServerConfig config(List<String> args, Map<String, String> env) {
    List<String> flags = new ArrayList<>(daemonFlags());
    flags.addAll(args);
    return ServerOptions.parse(flags.toArray(String[]::new), env);
  }

  ServerConfig config(List<String> args) {
    return config(args, Map.of());
  }

  List<String> volumes() {
    List<String> out = new ArrayList<>();
    for (ParsedDockerfile.Instruction v : runtime.all("VOLUME")) {
      out.addAll(v.args().startsWith("[") ? v.execForm() : v.words());
    }
    return out;
  }

  List<Integer> exposedPorts() {
    List<Integer> out = new ArrayList<>();
    for (ParsedDockerfile.Instruction e : runtime.all("EXPOSE")) {
      e.words().forEach(w -> out.add(Integer.parseInt(w.replace("/tcp", ""))));
    }
    return out;
  }

  /** The USER of the runtime stage, as {@code uid[:gid]}. */
  String user() {
    return runtime.last("USER").args();
  }

  long uid() {
    return Long.parseLong(user().split(":")[0]);
  }

  long gid() {
    String[] parts = user().split(":");
    return Long.parseLong(parts.length > 1 ? parts[1] : parts[0]);
  }
}
