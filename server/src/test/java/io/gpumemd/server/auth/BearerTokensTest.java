package io.gpumemd.server.auth;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.testing.FakeTicker;
import io.gpumemd.server.testing.LogCapture;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The token table: its format, its lookups, and its reload on the injected clock (no sleeping). */
class BearerTokensTest {
  private static final String ADMIN = "admin-token-0123456789";
  private static final String USER = "user-token-0123456789";
  private static final String NEW = "new-token-0123456789abc";

  @TempDir
  Path dir;
  private final FakeTicker ticker = new FakeTicker();

  private Path write(String name, String text) throws Exception {
    Path file = dir.resolve(name);
    Files.writeString(file, text);
    Files.setPosixFilePermissions(file, PosixFilePermissions.fromString("rw-------"));
    return file;
  }

  /** Replaces the file the way an editor or a Kubernetes Secret update does: a new file renamed over it. */
  private void replace(Path file, String text) throws Exception {
    Path next = write(file.getFileName() + ".next", text);
    Files.move(next, file, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
  }

  @Test
  void lookup_findsTenantAndRole_andNothingForOtherStrings() throws Exception {
    Path file = write("tokens", "# comment\n\n" + ADMIN + "  ops admin   # trailing comment\n" + USER + "\tteam-a user\n"
        + "other-token-0123456789 team-b\n");
    BearerTokens tokens = BearerTokens.load(file, ticker);
    assertEquals(3, tokens.size());
    assertEquals(new BearerTokens.Grant("ops", true), tokens.lookup(ADMIN));
    assertEquals(new BearerTokens.Grant("team-a", false), tokens.lookup(USER));
    assertEquals(new BearerTokens.Grant("team-b", false), tokens.lookup("other-token-0123456789"), "role defaults to user");
    assertNull(tokens.lookup("admin-token-012345678"), "a prefix is not the token");
    assertNull(tokens.lookup(ADMIN + "x"));
    assertNull(tokens.lookup(""));
  }

  @Test
  void changedFile_isReloadedAtTheNextCheck_atMostOnceASecond() throws Exception {
    Path file = write("tokens", USER + " team-a\n");
    BearerTokens tokens = BearerTokens.load(file, ticker);
    replace(file, NEW + " team-b admin\n");
    assertEquals("team-a", tokens.lookup(USER).tenant(), "not checked again within the second");
    assertNull(tokens.lookup(NEW));
    ticker.advance(1, TimeUnit.SECONDS);
    assertEquals(new BearerTokens.Grant("team-b", true), tokens.lookup(NEW));
    assertNull(tokens.lookup(USER), "a removed token is refused");
  }

  @Test
  void brokenFile_keepsTheOldTable_andWarnsOncePerVersion() throws Exception {
    Path file = write("tokens", USER + " team-a\n");
    BearerTokens tokens = BearerTokens.load(file, ticker);
    try (LogCapture log = new LogCapture(BearerTokens.class)) {
      replace(file, USER + " team-a superuser\n");
      for (int i = 0; i < 3; i++) {
        ticker.advance(1, TimeUnit.SECONDS);
        assertEquals("team-a", tokens.lookup(USER).tenant(), "the old table stays");
      }
      List<String> warnings = log.messages("WARN");
      assertEquals(1, warnings.size(), "one warning for one broken version: " + warnings);
      assertTrue(warnings.get(0).contains("changed but cannot be used: a role 'admin' or 'user' on line 1; found "
          + "'superuser'; keeping the previous 1 token(s)"), warnings.get(0));

      Files.delete(file);
      ticker.advance(1, TimeUnit.SECONDS);
      assertEquals("team-a", tokens.lookup(USER).tenant(), "a vanished file keeps the table too");
      assertEquals(2, log.messages("WARN").size(), log.messages("WARN").toString());
      assertTrue(log.messages("WARN").get(1).contains("cannot read it (there is no such file)"));

      replace(file, NEW + " team-c\n");
      ticker.advance(1, TimeUnit.SECONDS);
      assertEquals("team-c", tokens.lookup(NEW).tenant(), "a repaired file is used again");
    }
  }

  @Test
  void fileReadableByOthers_isLoadedWithAWarning() throws Exception {
    Path file = write("tokens", USER + " team-a\n");
    Files.setPosixFilePermissions(file, PosixFilePermissions.fromString("rw-r--r--"));
    try (LogCapture log = new LogCapture(BearerTokens.class)) {
      BearerTokens.load(file, ticker);
      assertEquals(List.of("tokens-file: " + file + " is readable by every user (expected: mode 0600 or 0400, "
          + "the tokens are secrets; chmod 600 " + file + ")"), log.messages("WARN"));
    }
  }
}
