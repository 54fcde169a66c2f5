package io.gpumemd.it.deploy;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.it.deploy.PromqlSelectors.Selector;
import io.gpumemd.server.testing.TestDaemon;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * {@code deploy/grafana/gpumemd.json} is a well-formed Grafana dashboard, and every metric,
 * label and label value its queries name is one a real daemon exports: the daemon runs
 * in-process (host backend), serves a few leases so that every series exists, and its
 * {@code /metrics} is scraped once for the whole class.
 */
class GrafanaDashboardTest {
  private static final String FILE = "deploy/grafana/gpumemd.json";
  private static final String DATASOURCE_REF = "${datasource}";
  private static final Pattern VARIABLE = Pattern.compile("\\$\\{?(\\w+)");
  private static final Pattern LABEL_VALUES =
      Pattern.compile("(?s)\\s*label_values\\((.*),\\s*([A-Za-z_][A-Za-z0-9_]*)\\s*\\)\\s*");
  private static final Pattern QUERY_RESULT = Pattern.compile("(?s)\\s*query_result\\((.*)\\)\\s*");

  private static MetricsScrape scrape;

  @BeforeAll
  static void scrapeRealDaemon() throws Exception {
    int port;
    try (ServerSocket s = new ServerSocket(0)) {
      port = s.getLocalPort();
    }
    try (TestDaemon daemon = TestDaemon.start("--metrics-port", Integer.toString(port), "--metrics-host", "127.0.0.1");
         GpuMemClient client = GpuMemClient.connect(daemon.unixTarget())) {
      // a miss then a hit on each device, one lease left open: every series has a sample
      for (int device = 0; device < 2; device++) {
        client.lease(device, 4096).close();
        client.lease(device, 4096).close();
      }
      try (Lease open = client.lease(0, 1 << 20)) {
        HttpResponse<String> response = HttpClient.newHttpClient().send(
            HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/metrics")).build(),
            HttpResponse.BodyHandlers.ofString());
        assertEquals(200, response.statusCode(), response.body());
        scrape = MetricsScrape.parse(response.body());
      }
    }
    assertTrue(scrape.has("gpumemd_pool_hits_total"), "scrape without the pool meters: " + scrape.metrics());
  }

  private static JsonObject dashboard() {
    return JsonParser.parseString(RepoFiles.read(FILE)).getAsJsonObject();
  }

  // --- structure -------------------------------------------------------------------------

  @Test
  void dashboard_hasUniqueIds_datasourceRefs_andNonOverlappingGrid() {
    JsonObject dashboard = dashboard();
    assertTrue(dashboard.get("schemaVersion").getAsInt() >= 36, "schemaVersion: " + dashboard.get("schemaVersion"));
    assertEquals("gpumemd", dashboard.get("uid").getAsString());
    List<String> problems = new ArrayList<>();
    List<JsonObject> panels = panels(dashboard);
    assertTrue(panels.size() > 10, "panels: " + panels.size());
    Set<Integer> ids = new HashSet<>();
    List<int[]> boxes = new ArrayList<>();
    List<String> boxNames = new ArrayList<>();
    for (JsonObject panel : panels) {
      String name = name(panel);
      if (!panel.has("id") || !ids.add(panel.get("id").getAsInt())) {
        problems.add(name + ": missing or duplicate id");
      }
      if (!DATASOURCE_REF.equals(datasourceUid(panel))) {
        problems.add(name + ": datasource " + panel.get("datasource") + " (expected: uid " + DATASOURCE_REF + ")");
      }
      JsonObject grid = panel.getAsJsonObject("gridPos");
      if (grid == null || !(grid.has("x") && grid.has("y") && grid.has("w") && grid.has("h"))) {
        problems.add(name + ": gridPos " + grid + " (expected: x, y, w, h)");
        continue;
      }
      int x = grid.get("x").getAsInt(), y = grid.get("y").getAsInt();
      int w = grid.get("w").getAsInt(), h = grid.get("h").getAsInt();
      if (x < 0 || y < 0 || w <= 0 || h <= 0 || x + w > 24) {
        problems.add(name + ": gridPos " + grid + " (expected: inside the 24-column grid)");
      }
      for (int j = 0; j < boxes.size(); j++) {
        int[] o = boxes.get(j);
        if (x < o[0] + o[2] && o[0] < x + w && y < o[1] + o[3] && o[1] < y + h) {
          problems.add(name + ": gridPos " + grid + " overlaps " + boxNames.get(j));
        }
      }
      boxes.add(new int[] {x, y, w, h});
      boxNames.add(name);
      if (isRow(panel)) {
        continue;
      }
      JsonArray targets = panel.getAsJsonArray("targets");
      if (targets == null || targets.isEmpty()) {
        problems.add(name + ": no queries");
        continue;
      }
      Set<String> refIds = new HashSet<>();
      for (JsonElement t : targets) {
        JsonObject target = t.getAsJsonObject();
        String ref = target.has("refId") ? target.get("refId").getAsString() : null;
        if (ref == null || !refIds.add(ref)) {
          problems.add(name + ": query " + ref + ": missing or duplicate refId");
        }
        if (!DATASOURCE_REF.equals(datasourceUid(target))) {
          problems.add(name + ": query " + ref + ": datasource " + target.get("datasource")
              + " (expected: uid " + DATASOURCE_REF + ")");
        }
      }
    }
    assertTrue(problems.isEmpty(), String.join("\n", problems));
  }

  @Test
  void templateVariables_datasourceAndDevice() {
    JsonObject datasource = variable(dashboard(), "datasource");
    assertEquals("datasource", datasource.get("type").getAsString());
    assertEquals("prometheus", datasource.get("query").getAsString());
    JsonObject device = variable(dashboard(), "device");
    assertEquals("query", device.get("type").getAsString());
    assertEquals(DATASOURCE_REF, datasourceUid(device));
    assertEquals("label_values(gpumemd_pool_hits_total, device)", variableQuery(device));
  }

  @Test
  void everyVariableAQueryUses_isDefined() {
    JsonObject dashboard = dashboard();
    Set<String> defined = new HashSet<>();
    for (JsonElement v : dashboard.getAsJsonObject("templating").getAsJsonArray("list")) {
      defined.add(v.getAsJsonObject().get("name").getAsString());
    }
    List<String> problems = new ArrayList<>();
    for (Query q : queries(dashboard)) {
      Matcher m = VARIABLE.matcher(q.expr());
      while (m.find()) {
        if (!m.group(1).startsWith("__") && !defined.contains(m.group(1))) {
          problems.add(q.where() + ": $" + m.group(1) + " is not a template variable " + defined);
        }
      }
    }
    assertTrue(problems.isEmpty(), String.join("\n", problems));
  }

  // --- the metrics against a real daemon -------------------------------------------------

  @Test
  void everyMetricAndLabel_isExportedByTheDaemon() {
    List<String> problems = unexported(dashboard(), scrape);
    assertTrue(problems.isEmpty(), "the dashboard names what the daemon does not export:\n"
        + String.join("\n", problems) + "\nexported: " + scrape.metrics());
  }

  @Test
  void check_reportsPanelAndMetric_forAnUnknownMetricOrLabel() {
    // the same check as above, on a fabricated dashboard: the real one's device variable, with
    // its metric misspelt, and one panel with three wrong queries and one right one
    JsonObject dashboard = JsonParser.parseString("""
        {"panels": [
          {"type": "timeseries", "id": 999, "title": "Fabricated",
           "targets": [
             {"refId": "A", "expr": "sum by (device) (rate(gpumemd_pool_hitz_total{device=~\\"$device\\"}[$__rate_interval]))"},
             {"refId": "B", "expr": "gpumemd_sessions{device=\\"0\\"}"},
             {"refId": "C", "expr": "gpumemd_lease_latency_seconds{quantile=\\"0.95\\"}"},
             {"refId": "D", "expr": "gpumemd_lease_latency_seconds{quantile=\\"0.999\\", result=\\"hit\\"}"}]}],
         "templating": {"list": []}}
        """).getAsJsonObject();
    JsonObject variable = variable(dashboard(), "device");
    variable.getAsJsonObject("query").addProperty("query", "label_values(gpumemd_pool_hits, device)");
    dashboard.getAsJsonObject("templating").getAsJsonArray("list").add(variable);

    List<String> problems = unexported(dashboard, scrape);

    String all = String.join("\n", problems);
    assertEquals(4, problems.size(), all);
    assertTrue(all.contains("panel 'Fabricated' (id 999), query A: metric gpumemd_pool_hitz_total is not exported"), all);
    assertTrue(all.contains("panel 'Fabricated' (id 999), query B: label device is not on gpumemd_sessions"), all);
    assertTrue(all.contains("panel 'Fabricated' (id 999), query C: gpumemd_lease_latency_seconds has no quantile=\"0.95\""), all);
    assertTrue(all.contains("variable device: metric gpumemd_pool_hits is not exported"), all);
  }

  @Test
  void selectors_skipFunctionsLabelListsStringsRangesAndVariables() {
    List<Selector> selectors = PromqlSelectors.of(
        "sum by (device, result) (rate(a_total{device=~\"$device\", result=\"x{y}\"}[$__rate_interval]))"
        + " / on (device) group_left (result) max without (quantile) (b) > bool 0.5 * 1e3"
        + " or histogram_quantile(0.99, c_bucket offset 5m) + ${datasource} and {__name__=\"d\"}");
    assertEquals(List.of("a_total", "b", "c_bucket", "d"), selectors.stream().map(Selector::metric).toList());
    assertEquals(List.of(new PromqlSelectors.Matcher("device", "=~", "$device"),
        new PromqlSelectors.Matcher("result", "=", "x{y}")), selectors.get(0).matchers());
  }

  /**
   * Every query of every panel and every query variable, checked against the scrape: the
   * metric exists, each matcher's label is on it (or is a Prometheus target label), and each
   * literal {@code =} value is one of its values. One line per problem naming where it is.
   */
  static List<String> unexported(JsonObject dashboard, MetricsScrape scrape) {
    List<String> problems = new ArrayList<>();
    for (Query q : queries(dashboard)) {
      List<Selector> selectors;
      String expr = q.expr();
      String variableLabel = null;
      Matcher labelValues = LABEL_VALUES.matcher(expr);
      Matcher queryResult = QUERY_RESULT.matcher(expr);
      if (q.variable() && labelValues.matches()) {
        expr = labelValues.group(1);
        variableLabel = labelValues.group(2);
      } else if (q.variable() && queryResult.matches()) {
        expr = queryResult.group(1);
      } else if (q.variable()) {
        problems.add(q.where() + ": unsupported variable query " + expr);
        continue;
      }
      try {
        selectors = PromqlSelectors.of(expr);
      } catch (IllegalArgumentException e) {
        problems.add(q.where() + ": " + e.getMessage());
        continue;
      }
      if (selectors.isEmpty()) {
        problems.add(q.where() + ": names no metric: " + expr);
      }
      for (Selector selector : selectors) {
        String metric = selector.metric();
        if (!scrape.has(metric)) {
          problems.add(q.where() + ": metric " + metric + " is not exported by the daemon");
          continue;
        }
        List<PromqlSelectors.Matcher> matchers = new ArrayList<>(selector.matchers());
        if (variableLabel != null) {
          matchers.add(new PromqlSelectors.Matcher(variableLabel, "=~", ".*"));
        }
        for (PromqlSelectors.Matcher m : matchers) {
          if (m.label().equals("__name__") || MetricsScrape.TARGET_LABELS.contains(m.label())) {
            continue;
          }
          if (!scrape.labels(metric).contains(m.label())) {
            problems.add(q.where() + ": label " + m.label() + " is not on " + metric
                + " (its labels: " + scrape.labels(metric) + ")");
          } else if (m.op().equals("=") && !m.value().contains("$")
              && !scrape.values(metric, m.label()).contains(m.value())) {
            problems.add(q.where() + ": " + metric + " has no " + m.label() + "=\"" + m.value()
                + "\" (its values: " + scrape.values(metric, m.label()) + ")");
          }
        }
      }
    }
    return problems;
  }

  // --- navigation ------------------------------------------------------------------------

  /** A PromQL expression and where it is: a panel's query or a variable's query. */
  record Query(String where, String expr, boolean variable) {}

  static List<Query> queries(JsonObject dashboard) {
    List<Query> queries = new ArrayList<>();
    for (JsonObject panel : panels(dashboard)) {
      JsonArray targets = panel.getAsJsonArray("targets");
      if (targets == null) {
        continue;
      }
      for (JsonElement t : targets) {
        JsonObject target = t.getAsJsonObject();
        String ref = target.has("refId") ? target.get("refId").getAsString() : "?";
        String expr = target.has("expr") ? target.get("expr").getAsString() : "";
        queries.add(new Query(name(panel) + ", query " + ref, expr, false));
      }
    }
    for (JsonElement v : dashboard.getAsJsonObject("templating").getAsJsonArray("list")) {
      JsonObject variable = v.getAsJsonObject();
      if ("query".equals(variable.get("type").getAsString())) {
        queries.add(new Query("variable " + variable.get("name").getAsString(), variableQuery(variable), true));
      }
    }
    return queries;
  }

  /** Every panel, rows included, with the panels of collapsed rows. */
  static List<JsonObject> panels(JsonObject dashboard) {
    List<JsonObject> panels = new ArrayList<>();
    for (JsonElement p : dashboard.getAsJsonArray("panels")) {
      JsonObject panel = p.getAsJsonObject();
      panels.add(panel);
      if (panel.has("panels")) {
        panel.getAsJsonArray("panels").forEach(inner -> panels.add(inner.getAsJsonObject()));
      }
    }
    return panels;
  }

  private static boolean isRow(JsonObject panel) {
    return "row".equals(panel.get("type").getAsString());
  }

  private static String name(JsonObject panel) {
    return "panel '" + (panel.has("title") ? panel.get("title").getAsString() : "")
        + "' (id " + panel.get("id") + ")";
  }

  private static String datasourceUid(JsonObject o) {
    JsonElement ds = o.get("datasource");
    if (ds == null || !ds.isJsonObject() || !ds.getAsJsonObject().has("uid")) {
      return null;
    }
    return ds.getAsJsonObject().get("uid").getAsString();
  }

  private static JsonObject variable(JsonObject dashboard, String name) {
    for (JsonElement v : dashboard.getAsJsonObject("templating").getAsJsonArray("list")) {
      if (name.equals(v.getAsJsonObject().get("name").getAsString())) {
        return v.getAsJsonObject();
      }
    }
    throw new AssertionError("no template variable " + name);
  }

  /** A query variable's query: a string in older dashboards, {"query": ...} since Grafana 10. */
  private static String variableQuery(JsonObject variable) {
    JsonElement q = variable.get("query");
    return q.isJsonObject() ? q.getAsJsonObject().get("query").getAsString() : q.getAsString();
  }
}
