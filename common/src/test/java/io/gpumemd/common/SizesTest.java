package io.gpumemd.common;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import org.junit.jupiter.api.Test;

class SizesTest {
  @Test
  void parse_acceptsBinarySuffixesAndSpaces() {
    assertEquals(4096, Sizes.parse("4096"));
    assertEquals(512L << 20, Sizes.parse("512MiB"));
    assertEquals(8L << 30, Sizes.parse("8GiB"));
    assertEquals(2L << 30, Sizes.parse("2g"));
    assertEquals(1L << 40, Sizes.parse("1 TiB"));
    assertEquals(3L << 10, Sizes.parse(" 3kb "));
  }

  @Test
  void parse_refusesWithWhatWasExpected() {
    assertEquals("a byte size such as 4096, 512MiB or 8GiB",
        assertThrows(IllegalArgumentException.class, () -> Sizes.parse("-1")).getMessage());
    assertEquals("a byte size with suffix B, KiB, MiB, GiB or TiB",
        assertThrows(IllegalArgumentException.class, () -> Sizes.parse("5 parsecs")).getMessage());
    assertEquals("a size below 8 EiB",
        assertThrows(IllegalArgumentException.class, () -> Sizes.parse("99999999999TiB")).getMessage());
    assertEquals("a size below 8 EiB",
        assertThrows(IllegalArgumentException.class, () -> Sizes.parse("99999999999999999999")).getMessage());
  }

  @Test
  void format_label_andMillis() {
    assertEquals("512 B", Sizes.format(512));
    assertEquals("64.0 MiB", Sizes.format(64L << 20));
    assertEquals("1.5 GiB", Sizes.format(3L << 29));
    assertEquals("-2.0 KiB", Sizes.format(-2048));
    assertEquals("64MiB", Sizes.label(64L << 20));
    assertEquals("1536B", Sizes.label(1536));
    assertEquals("850 ms", Sizes.formatMillis(850));
    assertEquals("12.3 s", Sizes.formatMillis(12_300));
    assertEquals("5m07s", Sizes.formatMillis(307_000));
    assertEquals("2h03m", Sizes.formatMillis(7_380_000));
  }
}
