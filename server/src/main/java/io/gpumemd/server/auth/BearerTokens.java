package io.gpumemd.server.auth;

import io.gpumemd.common.Ticker;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.AccessDeniedException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.attribute.BasicFileAttributes;
import java.nio.file.attribute.PosixFilePermission;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Pattern;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The bearer tokens of {@code --tokens-file}: which tenant each token acts for, and whether it
 * is an admin. The file holds one token a line, {@code TOKEN TENANT [admin|user]} separated by
 * blanks ({@code user} when left out); {@code #} starts a comment, blank lines are skipped. A
 * token has at least {@value #MIN_TOKEN_LENGTH} characters ({@code openssl rand -hex 32}), a
 * tenant is {@code [A-Za-z0-9][A-Za-z0-9._@-]*}. No message ever contains a token.
 *
 * <p>Only SHA-256 hashes of the tokens are kept, and a lookup compares the presented token's
 * hash with every entry in constant time ({@link MessageDigest#isEqual}), so neither the
 * comparison nor the table's order tells how much of a guess was right.
 *
 * <p>Reload: a lookup checks the file's modification time, size and inode at most once a
 * second (a Kubernetes Secret volume swaps a symlink, an editor renames a new file over the old:
 * both change the inode); a changed file is parsed again and replaces the table. A file that no
 * longer parses keeps the old table, with one WARN per broken version.
 *
 * <p>Thread-safe: the table is an immutable snapshot behind a volatile field; one caller at a
 * time reloads (the others use the current table meanwhile).
 */
public final class BearerTokens {
  private static final Logger log = LoggerFactory.getLogger(BearerTokens.class);
  static final int MIN_TOKEN_LENGTH = 16;
  private static final Pattern TENANT = Pattern.compile("[A-Za-z0-9][A-Za-z0-9._@-]{0,63}");
  private static final long CHECK_INTERVAL_NANOS = TimeUnit.SECONDS.toNanos(1);

  /** What a valid token grants. */
  public record Grant(String tenant, boolean admin) {}

  private record Entry(byte[] hash, Grant grant) {}

  /** The file's identity and contents at one moment. */
  private record Version(Object fileKey, long modifiedNanos, long size) {}

  private record Table(List<Entry> entries, Version version) {}

  private final Path file;
  private final Ticker ticker;
  private final AtomicLong nextCheck;
  private volatile Table table;
  /** The version last found broken, warned about once; written by the one caller reloading. */
  private volatile Version brokenVersion;

  private BearerTokens(Path file, Ticker ticker, Table table) {
    this.file = file;
    this.ticker = ticker;
    this.table = table;
    this.nextCheck = new AtomicLong(ticker.nanos() + CHECK_INTERVAL_NANOS);
  }

  /**
   * Loads the file, warning when others than its owner may read it.
   *
   * @throws IllegalArgumentException whose message says what is wrong with the file (the
   *     "expected" part of a configuration problem)
   */
  public static BearerTokens load(Path file, Ticker ticker) {
    Table table = read(file);
    warnIfReadableByOthers(file);
    log.info("Bearer tokens: {} token(s) from {}", table.entries().size(), file);
    return new BearerTokens(file, ticker, table);
  }

  /** Checks that a file would load, for configuration validation; nothing is kept. */
  public static void check(Path file) {
    read(file);
  }

  public Path file() {
    return file;
  }

  /** Live tokens in the current table. */
  public int size() {
    return table.entries().size();
  }

  /** What {@code token} grants, or null for a token the file does not list. */
  public Grant lookup(String token) {
    reloadIfDue();
    byte[] hash = sha256(token);
    Grant found = null;
    for (Entry e : table.entries()) {
      // every entry is compared, a match does not end the loop early: the time taken tells
      // nothing about which entry, if any, matched
      if (MessageDigest.isEqual(e.hash(), hash)) {
        found = e.grant();
      }
    }
    return found;
  }

  private void reloadIfDue() {
    long now = ticker.nanos();
    long due = nextCheck.get();
    if (now - due < 0 || !nextCheck.compareAndSet(due, now + CHECK_INTERVAL_NANOS)) {
      return; // not yet, or another caller is checking
    }
    Version current = table.version();
    Version seen;
    try {
      seen = version(file);
    } catch (IOException e) {
      warnBroken(new Version(null, -1, -1), "cannot read it (" + describe(e) + ")");
      return;
    }
    if (seen.equals(current) || seen.equals(brokenVersion)) {
      return;
    }
    try {
      Table fresh = read(file);
      table = fresh;
      brokenVersion = null;
      warnIfReadableByOthers(file);
      log.info("Bearer tokens reloaded: {} token(s) from {}", fresh.entries().size(), file);
    } catch (IllegalArgumentException e) {
      warnBroken(seen, e.getMessage());
    }
  }

  private void warnBroken(Version version, String why) {
    if (!version.equals(brokenVersion)) {
      brokenVersion = version;
      log.warn("tokens-file: {} changed but cannot be used: {}; keeping the previous {} token(s)",
          file, why, table.entries().size());
    }
  }

  private static Table read(Path file) {
    Version version;
    List<String> lines;
    try {
      version = version(file);
      lines = Files.readAllLines(file, StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new IllegalArgumentException("a tokens file (lines 'TOKEN TENANT [admin|user]'); " + describe(e));
    }
    List<Entry> entries = new ArrayList<>();
    Map<String, Integer> lineOfHash = new HashMap<>();
    for (int i = 0; i < lines.size(); i++) {
      int n = i + 1;
      String line = lines.get(i);
      int hashMark = line.indexOf('#');
      String[] f = (hashMark >= 0 ? line.substring(0, hashMark) : line).trim().split("\\s+");
      if (f.length == 1 && f[0].isEmpty()) {
        continue;
      }
      // the token itself is never quoted: the message may end up in a log
      if (f.length < 2 || f.length > 3) {
        throw new IllegalArgumentException("lines 'TOKEN TENANT [admin|user]'; line " + n + " has " + f.length
            + " field(s)");
      }
      if (f[0].length() < MIN_TOKEN_LENGTH) {
        throw new IllegalArgumentException("tokens of at least " + MIN_TOKEN_LENGTH
            + " characters (e.g. from 'openssl rand -hex 32'); the token on line " + n + " has " + f[0].length());
      }
      if (!TENANT.matcher(f[1]).matches()) {
        throw new IllegalArgumentException("a tenant name of letters, digits and ._@- (at most 64) on line " + n
            + "; found '" + f[1] + "'");
      }
      String role = f.length == 3 ? f[2] : "user";
      if (!role.equals("admin") && !role.equals("user")) {
        throw new IllegalArgumentException("a role 'admin' or 'user' on line " + n + "; found '" + role + "'");
      }
      byte[] hash = sha256(f[0]);
      Integer earlier = lineOfHash.putIfAbsent(hexOf(hash), n);
      if (earlier != null) {
        throw new IllegalArgumentException("each token once; line " + n + " repeats the token of line " + earlier);
      }
      entries.add(new Entry(hash, new Grant(f[1], role.equals("admin"))));
    }
    return new Table(List.copyOf(entries), version);
  }

  private static Version version(Path file) throws IOException {
    BasicFileAttributes a = Files.readAttributes(file, BasicFileAttributes.class);
    return new Version(a.fileKey(), a.lastModifiedTime().to(TimeUnit.NANOSECONDS), a.size());
  }

  private static void warnIfReadableByOthers(Path file) {
    try {
      Set<PosixFilePermission> p = Files.getPosixFilePermissions(file);
      if (p.contains(PosixFilePermission.GROUP_READ) || p.contains(PosixFilePermission.OTHERS_READ)) {
        log.warn("tokens-file: {} is readable by {} (expected: mode 0600 or 0400, the tokens are secrets; "
            + "chmod 600 {})", file, p.contains(PosixFilePermission.OTHERS_READ) ? "every user" : "its group", file);
      }
    } catch (IOException | UnsupportedOperationException e) {
      // permissions unknown: nothing to warn about
    }
  }

  private static String describe(IOException e) {
    if (e instanceof NoSuchFileException) {
      return "there is no such file";
    }
    if (e instanceof AccessDeniedException) {
      return "permission denied";
    }
    return Objects.toString(e.getMessage(), e.getClass().getSimpleName());
  }

  private static byte[] sha256(String token) {
    try {
      return MessageDigest.getInstance("SHA-256").digest(token.getBytes(StandardCharsets.UTF_8));
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException("every Java runtime has SHA-256", e);
    }
  }

  private static String hexOf(byte[] bytes) {
    StringBuilder out = new StringBuilder();
    for (byte b : bytes) {
      out.append(Character.forDigit((b >> 4) & 0xf, 16)).append(Character.forDigit(b & 0xf, 16));
    }
    return out.toString();
  }
}
