package io.gpumemd.it.deploy;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.yaml.snakeyaml.LoaderOptions;
import org.yaml.snakeyaml.Yaml;
import org.yaml.snakeyaml.constructor.SafeConstructor;

/**
 * Reads the repository's deployment files (found by walking up from the working directory to
 * the directory holding {@code deploy/}) and navigates the plain maps and lists SnakeYAML
 * makes of them, failing with the path that is missing or of the wrong type.
 */
final class RepoFiles {
  private RepoFiles() {}

  static Path root() {
    for (Path dir = Path.of("").toAbsolutePath(); dir != null; dir = dir.getParent()) {
      if (Files.isDirectory(dir.resolve("deploy")) && Files.isRegularFile(dir.resolve("pom.xml"))) {
        return dir;
      }
    }
    throw new IllegalStateException("no repository root (a directory with deploy/ and pom.xml) above "
        + Path.of("").toAbsolutePath());
  }

  static String read(String relative) {
    try {
      return Files.readString(root().resolve(relative));
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** Every document of a YAML file (safe constructor: plain maps, lists and scalars). */
  static List<Map<String, Object>> yamlDocuments(String relative) {
    List<Map<String, Object>> docs = new ArrayList<>();
    for (Object doc : new Yaml(new SafeConstructor(new LoaderOptions())).loadAll(read(relative))) {
      if (doc != null) {
        docs.add(asMap(doc, relative));
      }
    }
    return docs;
  }

  /** The volume mounted at {@code path}, given volume name to mount path. */
  static String volumeAt(Map<String, String> mounts, String path) {
    return mounts.entrySet().stream().filter(e -> e.getValue().equals(path)).map(Map.Entry::getKey)
        .findFirst().orElseThrow(() -> new AssertionError("no volume mounted at " + path + ": " + mounts));
  }

  // --- navigation in parsed YAML -------------------------------------------------------

  @SuppressWarnings("unchecked")
  static Map<String, Object> asMap(Object value, String what) {
    if (!(value instanceof Map)) {
      throw new AssertionError(what + ": expected a mapping, found " + describe(value));
    }
    return (Map<String, Object>) value;
  }

  @SuppressWarnings("unchecked")
  static List<Object> asList(Object value, String what) {
    if (!(value instanceof List)) {
      throw new AssertionError(what + ": expected a sequence, found " + describe(value));
    }
    return (List<Object>) value;
  }

  /** The mapping at {@code path} below {@code map}. */
  static Map<String, Object> map(Map<String, Object> map, String... path) {
    return asMap(get(map, path), String.join(".", path));
  }

  /** The sequence at {@code path} below {@code map}, or an empty list when absent. */
  static List<Object> listOrEmpty(Map<String, Object> map, String... path) {
    Object value = find(map, path);
    return value == null ? List.of() : asList(value, String.join(".", path));
  }

  /** The value at {@code path} rendered as a string (YAML numbers and booleans included). */
  static String string(Map<String, Object> map, String... path) {
    return String.valueOf(get(map, path));
  }

  /** The value at {@code path}; fails when any step is missing. */
  static Object get(Map<String, Object> map, String... path) {
    Object value = find(map, path);
    if (value == null) {
      throw new AssertionError("missing: " + String.join(".", path));
    }
    return value;
  }

  /** The value at {@code path}, or null when any step is missing. */
  static Object find(Map<String, Object> map, String... path) {
    Object current = map;
    for (String key : path) {
      if (!(current instanceof Map)) {
        return null;
      }
      current = ((Map<?, ?>) current).get(key);
    }
    return current;
  }

  static List<String> strings(Object value, String what) {
    List<String> out = new ArrayList<>();
    for (Object item : asList(value, what)) {
      out.add(String.valueOf(item));
    }
    return out;
  }

  private static String describe(Object value) {
    return value == null ? "nothing" : value.getClass().getSimpleName() + " " + value;
  }
}
