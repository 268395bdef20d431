"""The shipped pairs' training data, shared by the discrete-token families' recipes: class-balanced crops of the
shipped photographs as tokenizer codes, and the hand-written captions of each photograph (the text-to-image pairs
read them as prompts)."""
from __future__ import annotations

import torch

from vvs.models.vq import VQModel
from vvs.train.data import PHOTOS, balanced_labels, load_photos, random_crops
from vvs.train.tokenizer import interior_codes

CAPTIONS: dict[str, list[str]] = {
    "astronaut": ["a portrait of an astronaut in a white space suit", "a smiling woman astronaut with a flag",
                  "an astronaut holding a helmet", "a photo of an astronaut"],
    "chelsea": ["a photo of a cat", "a tabby cat looking to the side", "a close-up of a ginger cat's face",
                "a cat with green eyes and whiskers"],
    "coffee": ["a cup of coffee on a saucer", "a white coffee cup with a spoon", "a photo of a cup of coffee",
               "coffee in a cup on a wooden table"],
    "rocket": ["a rocket on the launch pad", "a photo of a rocket before launch", "a white rocket against the sky",
               "a space rocket standing on a tower"],
    "hubble_deep_field": ["galaxies in deep space", "a telescope image of distant galaxies",
                          "a dark sky full of galaxies and stars", "the hubble deep field"],
    "immunohistochemistry": ["a microscope image of stained tissue", "brown and blue cells under a microscope",
                             "a stained tissue sample", "immunohistochemistry of tissue"],
    "retina": ["a photo of the retina of an eye", "an eye fundus with red blood vessels",
               "an orange retina with blood vessels", "a medical image of the back of an eye"],
    "brick": ["a brick wall", "red bricks and mortar", "a texture of old bricks", "a close-up of a brick wall"],
    "grass": ["green grass", "a lawn of green grass", "a texture of grass blades", "a close-up of grass"],
    "gravel": ["grey gravel", "a texture of small stones", "a close-up of gravel", "pebbles on the ground"],
    "camera": ["a black and white photo of a cameraman", "a man with a camera on a tripod",
               "a photographer in a coat on a field", "a grey photo of a man with a camera"],
    "coins": ["old coins on a dark background", "a grey photo of many coins", "rows of ancient coins",
              "a collection of coins"],
    "cell": ["a microscope image of a cell", "a grey image of a single cell", "a cell under a microscope",
             "a blurry grey cell"],
    "china": ["a chinese temple with a red roof", "a pagoda under a blue sky", "a temple among trees",
              "a photo of a building in china"],
    "flower": ["a pink flower", "a close-up of a dahlia", "a flower with pink petals", "a photo of a flower"],
    "grace_hopper": ["a portrait of grace hopper", "a woman in a navy uniform", "an old portrait of an officer",
                     "a photo of a woman in uniform"],
}


@torch.no_grad()
def tokenize_crops(vq: VQModel, num: int, size: int, seed: int, batch: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """``num`` class-balanced random crops -> ``(labels [num], tokens [num, (size / downsample)**2])``, each crop's
    codes computed inside its reflection-padded canvas (``interior_codes``: no cell is a border cell)."""
    photos = load_photos()
    gen = torch.Generator().manual_seed(seed)
    labels = balanced_labels(num, len(photos), gen)
    tokens = []
    for i in range(0, num, batch):
        tokens.append(interior_codes(vq, random_crops(photos, labels[i : i + batch], size, gen)))
    return labels, torch.cat(tokens)


def caption_list() -> tuple[list[str], torch.Tensor]:
    """Every caption, and the photo (class) each describes."""
    texts, photos = [], []
    for i, photo in enumerate(PHOTOS):
        texts += CAPTIONS[photo.name]
        photos += [i] * len(CAPTIONS[photo.name])
    return texts, torch.tensor(photos)


def random_captions(caption_photo: torch.Tensor, photos: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """For each photo id in ``photos``, the index of one of its captions, drawn uniformly."""
    by_photo = [torch.nonzero(caption_photo == p).flatten() for p in range(len(PHOTOS))]
    return torch.stack([by_photo[p][torch.randint(0, len(by_photo[p]), (1,), generator=gen)]
                        for p in photos.tolist()]).flatten()
