package io.gpumemd.it.cuda;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A MIG-like variant of the stand-in CUDA driver, for the UUID tests of issue 33 item 6: built
 * from the stand-in's own objects (found beside the {@code libcuda.so.1} on {@code
 * LD_LIBRARY_PATH}, in its {@code obj/}) with one change: the first version of {@code
 * cuDeviceGetUuid} answers one "parent GPU" UUID ({@code GPU-aaaaaaaa-…}) for every device,
 * while {@code cuDeviceGetUuid_v2} answers each device's own, as a GPU split into MIG instances
 * does. (The stand-in's {@code _v2} calls its first version: that call is renamed in its object
 * with {@code objcopy}, so the stand-in's {@code _v2} still reaches its own.) A process that
 * names devices by the first version sees two devices with one UUID.
 */
final class MigStandIn {
  static final String PARENT_UUID = "GPU-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa";

  private static final String FIRST_VERSION = """
      #include <string.h>
      typedef struct { unsigned char bytes[16]; } CUuuid;
      __attribute__((visibility("default"))) int cuDeviceGetUuid(CUuuid *u, int device) {
          (void) device;
          if (!u) return 1;
          memset(u->bytes, 0xaa, 16);
          return 0;
      }
      """;

  private MigStandIn() {}

  /**
   * Builds the driver into {@code dir} ({@code dir/libcuda.so.1}).
   *
   * @return null when built, else why not (the caller skips)
   */
  static String build(Path dir) throws Exception {
    Path obj = null;
    for (String entry : String.valueOf(System.getenv("LD_LIBRARY_PATH")).split(":")) {
      if (!entry.isEmpty() && Files.isRegularFile(Path.of(entry, "obj", "core.o"))
          && Files.isRegularFile(Path.of(entry, "libcuda.so.1"))) {
        obj = Path.of(entry, "obj");
        break;
      }
    }
    if (obj == null) {
      return "no stand-in driver build (obj/core.o beside libcuda.so.1) on LD_LIBRARY_PATH";
    }
    List<String> objects = new ArrayList<>();
    try (var list = Files.list(obj)) {
      for (Path o : list.filter(p -> p.toString().endsWith(".o")).sorted().toList()) {
        Path copy = dir.resolve(o.getFileName());
        Files.copy(o, copy);
        objects.add(copy.toString());
      }
    }
    String why = run(List.of("objcopy", "--redefine-sym", "cuDeviceGetUuid=standin_cuDeviceGetUuid_first",
        dir.resolve("core.o").toString()));
    if (why != null) {
      return why;
    }
    Files.writeString(dir.resolve("first.c"), FIRST_VERSION, StandardCharsets.UTF_8);
    why = run(List.of("cc", "-fPIC", "-c", dir.resolve("first.c").toString(), "-o", dir.resolve("first.o").toString()));
    if (why != null) {
      return why;
    }
    objects.add(dir.resolve("first.o").toString());
    List<String> link = new ArrayList<>(List.of("cc", "-shared", "-pthread", "-Wl,-soname,libcuda.so.1", "-o",
        dir.resolve("libcuda.so.1").toString()));
    link.addAll(objects);
    return run(link);
  }

  private static String run(List<String> command) throws Exception {
    Process p;
    try {
      p = new ProcessBuilder(command).redirectErrorStream(true).start();
    } catch (IOException e) {
      return command.get(0) + " cannot run: " + e.getMessage();
    }
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    if (!p.waitFor(60, TimeUnit.SECONDS) || p.exitValue() != 0) {
      throw new AssertionError(String.join(" ", command) + " failed:\n" + out);
    }
    return null;
  }
}
