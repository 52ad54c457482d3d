// The text the generated tokenizers learn their merges from: English prose,
// code, numbers, accented Latin, Greek, Cyrillic, CJK and emoji, so that the
// vocabularies hold multi-byte pieces and leave rarer characters to byte
// fallback.

#include <string>

#include "common/model/generate/tokenizer_gen.h"

namespace trident::model::generate {

const std::string& TrainingCorpus() {
  static const std::string* corpus = new std::string(
      "The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox "
      "knew it. Once upon a time, in a land far away, there lived a curious engineer who "
      "built machines that could talk. Every morning she would wake up, brew a pot of "
      "coffee, and ask the newest machine a question it had never heard before. The "
      "machines answered in their own ways: some with numbers, some with stories, and "
      "some with silence. She wrote down every answer in a notebook that grew thicker "
      "with each passing season.\n"
      "It's a truth universally acknowledged that a single server in possession of a good "
      "cache must be in want of more memory. We'll see what they've done; I'm sure you'd "
      "agree that it isn't what we hoped. THEY'RE HERE and IT'S LATE.\n"
      "In 2024, the cluster served 1234567 requests at 98.6% availability; the median "
      "latency was 42 ms and the p99 was 315 ms. Call 555-0199 or visit room 101 at 9:30. "
      "Version 3.14.159 shipped on 2026-11-21 with 16 GiB of cache per node and 8 nodes.\n"
      "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n"
      "for (int i = 0; i < 10; ++i) { total += values[i] * weights[i]; }\n"
      "if (status.ok()) { return result; } else { return status; }\n"
      "import numpy as np\nx = np.zeros((4, 4), dtype=np.float32)\nprint(x.sum())\n"
      "Café crème brûlée, naïve façade, "
      "über schön, mañana, São Paulo, Zürich, "
      "été à la plage, déjà vu, café au lait, "
      "café noir, crème fraîche.\n"
      "Γεια σου κόσ"
      "με, γεια σου. "
      "Привет, мир! "
      "Привет всем.\n"
      "你好，世界。"
      "你好吗？世界很"
      "大。你好世界。"
      "こんにちは、こ"
      "んにちは。\n"
      "Emoji time: 😀 😀 🚀 launch 🚀 "
      "again 😀 and a heart ❤ and a globe 🌍.\n"
      "The servers talked to each other all night. Each server kept a list of the others, "
      "and when one of them went quiet, the rest noticed within a second and took over its "
      "work. Nothing was lost. The engineers slept well, because the system was built to "
      "survive the failure of any single part, and they had tested it many times.\n"
      "Questions and answers: What is the capital of France? Paris. What is two plus two? "
      "Four. Who wrote the notebook? The engineer did. Where are the machines? In the lab, "
      "on the third floor, next to the window that looks over the river.\n");
  return *corpus;
}

}  // namespace trident::model::generate
