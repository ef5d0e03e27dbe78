// The web page's JavaScript (gptlite/web/page/gptlite.js and tokenizers.js, from the folder given) under Node, for
// tests/web/test_export.py:
// reads one JSON request on standard input, writes one JSON answer.
//   {"tokenizer": form, "texts": [...]}                       -> {"ids": [[...], ...], "texts": [...]}: the ids
//                                                                and those ids decoded back, as the page writes
//   {"tokenizer": form, "chat": pieces, "messages": [...]}    -> {"ids": [...]}
//   {"noise": [[seed, index], ...], "vocabulary_size": V}     -> {"noise": [[...], ...]}
//   {"sample": [{logits, settings, noise_of: [seed, index] | null, seen}, ...]} -> {"tokens": [...],
//                                                                "probabilities": [[...], ...]}: each draw, and
//                                                                the distribution it draws from
//   {"settings": [{setting, text}, ...]}                      -> {"read": [{value} or {error}, ...]}
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [, , folder] = process.argv;
const web = {
  ...(await import(pathToFileURL(`${folder}/gptlite.js`).href)),
  ...(await import(pathToFileURL(`${folder}/tokenizers.js`).href)),
};
const request = JSON.parse(readFileSync(0, "utf8"));
let answer;
if (request.texts) {
  const tokenizer = web.makeTokenizer(request.tokenizer);
  const ids = request.texts.map((text) => tokenizer.encode(text));
  const decoded = ids.map((row) => {
    const decoder = tokenizer.decoder();
    return row.map((id) => decoder.add(id)).join("") + decoder.finish();
  });
  answer = { ids, texts: decoded };
} else if (request.chat) {
  const tokenizer = web.makeTokenizer(request.tokenizer);
  answer = { ids: [...request.chat.start_ids, ...tokenizer.encode(web.chatText(request.chat, request.messages))] };
} else if (request.noise) {
  answer = { noise: request.noise.map(([seed, index]) => [...web.uniformNoise(seed, index, request.vocabulary_size)]) };
} else if (request.settings) {
  answer = { read: request.settings.map(({ setting, text }) => web.settingOf(setting, text)) };
} else {
  answer = { tokens: request.sample.map(({ logits, settings, noise_of: noiseOf, seen }) => web.sampleNext(
    Float32Array.from(logits), settings, noiseOf && web.uniformNoise(noiseOf[0], noiseOf[1], logits.length),
    seen && new Set(seen))),
  probabilities: request.sample.map(({ logits, settings, seen }) => [...web.nextTokenProbabilities(
    Float32Array.from(logits), settings, seen && new Set(seen))]) };
}
process.stdout.write(JSON.stringify(answer));
