package io.gpumemd.it.cuda;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * Variants of the stand-in CUDA driver that answer one call otherwise, for what the stand-in
 * models one way and a real machine another: built from the stand-in's own objects (found beside
 * the {@code libcuda.so.1} on {@code LD_LIBRARY_PATH}, in its {@code obj/}), with that call's
 * symbol renamed in them ({@code objcopy --redefine-sym}, which renames the stand-in's own calls
 * to it too, so the rest of the stand-in keeps its own answer) and a replacement linked in.
 * Processes on a variant share the stand-in's devices, UUIDs and memory with processes on the
 * stand-in itself.
 *
 * <ul>
 *   <li>{@link #mig}: the first version of {@code cuDeviceGetUuid} answers one "parent GPU" UUID
 *       ({@link #PARENT_UUID}) for every device, while {@code cuDeviceGetUuid_v2} answers each
 *       device's own, as a GPU split into MIG instances does;
 *   <li>{@link #peers}: {@code cuDeviceCanAccessPeer} answers yes between any two devices, as on
 *       an NVLink machine (the stand-in answers no).
 * </ul>
 */
final class StandInVariant {
  static final String PARENT_UUID = "GPU-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa";

  private static final String MIG = """
      #include <string.h>
      typedef struct { unsigned char bytes[16]; } CUuuid;
      __attribute__((visibility("default"))) int cuDeviceGetUuid(CUuuid *u, int device) {
          (void) device;
          if (!u) return 1;
          memset(u->bytes, 0xaa, 16);
          return 0;
      }
      """;

  private static final String PEERS = """
      __attribute__((visibility("default"))) int cuDeviceCanAccessPeer(int *can, int device, int peer) {
          if (!can) return 1;
          *can = device != peer;
          return 0;
      }
      """;

  private StandInVariant() {}

  /** The MIG-like driver in {@code dir}; null when built, else why not (the caller skips). */
  static String mig(Path dir) throws Exception {
    return build(dir, "cuDeviceGetUuid", MIG);
  }

  /** The driver whose devices are all peers, in {@code dir}; null when built, else why not. */
  static String peers(Path dir) throws Exception {
    return build(dir, "cuDeviceCanAccessPeer", PEERS);
  }

  private static String build(Path dir, String symbol, String replacement) throws Exception {
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
    for (String o : objects) {
      String why = run(List.of("objcopy", "--redefine-sym", symbol + "=standin_replaced_" + symbol, o));
      if (why != null) {
        return why;
      }
    }
    Files.writeString(dir.resolve("replacement.c"), replacement, StandardCharsets.UTF_8);
    String why = run(List.of("cc", "-fPIC", "-c", dir.resolve("replacement.c").toString(), "-o",
        dir.resolve("replacement.o").toString()));
    if (why != null) {
      return why;
    }
    objects.add(dir.resolve("replacement.o").toString());
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
